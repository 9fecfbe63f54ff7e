// The text of a stored exception, for an error that reports an earlier one.
#pragma once

#include <exception>
#include <string>

namespace dtrain {

// what() of the exception in `e`; "unknown error" for one that is no std::exception.
std::string message_of(std::exception_ptr e);

}  // namespace dtrain
