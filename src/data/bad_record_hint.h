// What a damaged shard file's error tells its reader to do, in the words of whichever API they
// use: the same text from C++, Python and `dtrain data`.
#pragma once

namespace dtrain::data {

inline constexpr const char* kBadRecordHint =
    "write it again, or train without its bad records: ShardedDataset(..., "
    "on_bad_record=\"skip\") in Python, OnBadRecord::kSkip in C++";

}  // namespace dtrain::data
