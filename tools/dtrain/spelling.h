// Mistyped commands and options get the closest correct spelling, and mpirun's or torchrun's
// spellings that mean something else here get a sentence saying what to write instead.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

namespace dtrain::tools {

// The candidate nearest to `word` by edit distance, when it is near enough to be a typo.
std::optional<std::string> closest(std::string_view word,
                                   const std::vector<std::string>& candidates);

// Every spelling of the subcommand's options ("--nproc-per-node", "-n", ...).
std::vector<std::string> option_spellings(const CLI::App& command);

// Before CLI11 parses: an unknown subcommand ("dtrain rn": did you mean run?), also one level
// down ("dtrain data lst": did you mean list?), and `-np` given to `dtrain run` (mpirun's flag;
// CLI11 would read it as -n with the value "p") throw InvalidArgumentError with the fix.
void check_spelling(const CLI::App& app, int argc, const char* const* argv);

}  // namespace dtrain::tools
