// Post-mortem of a failed collective: every rank that hears of the failure writes what it
// called as that collective into the store, and the ranks that failed read everyone's entries
// back, so the error says "ranks 0, 1, 3 called broadcast(f32, 4096, root 0); rank 2 called
// all_reduce(f32, 1024, sum)" instead of only naming the connection that broke. Costs nothing
// until something fails. What a rank called is its group's CallHistory (comm/call_history.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "dtrain/store.h"

namespace dtrain::comm {

// The store key of rank `rank`'s statement on collective #seq of `group`.
std::string postmortem_key(const std::string& group, uint32_t seq, int rank);

// Writes this rank's entry for collective `seq` of `group`.
void publish_postmortem(Store& store, const std::string& group, int rank, uint32_t seq,
                        const std::string& entry);
// Reads every rank's entry (waiting at most `wait` for missing ones, but not for ranks whose
// connection `lost` describes, nor for ranks that wrote about another collective: they will never
// write about this one) and groups the ranks by what they did:
// "ranks 0, 2: called ...; rank 1: called ...; rank 3: gone (its connection broke)". `lost(r)`
// says why rank r's connection is down ("gone (its connection broke)", or that it did not
// answer within the limit), or nothing while it is up.
using LostConnection = std::function<std::optional<std::string>(int rank)>;
std::string collect_postmortem(Store& store, const std::string& group, int size, uint32_t seq,
                               std::chrono::milliseconds wait, const LostConnection& lost = {});

}  // namespace dtrain::comm
