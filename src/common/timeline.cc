// Timeline: events kept in memory, written as a Chrome-trace JSON array at exit.
#include "dtrain/timeline.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "common/env.h"
#include "common/log.h"

namespace dtrain {

struct Timeline::State {
  std::string path;
  int rank = 0;
  Clock::time_point origin = Clock::now();
  std::mutex mutex;                 // guards events and tracks
  std::vector<std::string> events;  // one JSON object each
  std::vector<std::string> tracks;  // index = tid
  bool written = false;
};

namespace {

std::string rank_path(const std::string& base, int rank) {
  std::filesystem::path p(base);
  std::string ext = p.has_extension() ? p.extension().string() : ".json";
  p.replace_extension();
  return fmt::format("{}.rank{}{}", p.string(), rank, ext);
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace

Timeline* Timeline::get(int rank) {
  static std::mutex mutex;  // guards instance
  static std::unique_ptr<Timeline> instance;
  static bool checked = false;
  std::lock_guard lock(mutex);
  if (!checked || (instance == nullptr && rank >= 0)) {
    checked = true;
    std::string base = env::get_string(env::kTimeline);
    if (!base.empty() && rank >= 0) {
      instance.reset(new Timeline(rank_path(base, rank), rank));
      std::atexit([] {
        if (Timeline* t = Timeline::get()) t->flush();
      });
    } else if (base.empty()) {
      return nullptr;
    } else {
      checked = false;  // set, but the rank is not known yet: decide at the next call
    }
  }
  return instance.get();
}

Timeline::Timeline(std::string path, int rank) : state_(std::make_unique<State>()) {
  state_->path = std::move(path);
  state_->rank = rank;
}

Timeline::~Timeline() { flush(); }

void Timeline::add(const std::string& name, const std::string& track, Clock::time_point start,
                   Clock::time_point end, const std::string& args_json) {
  auto us = [&](Clock::time_point t) {
    return std::chrono::duration<double, std::micro>(t - state_->origin).count();
  };
  std::lock_guard lock(state_->mutex);
  size_t tid = 0;
  while (tid < state_->tracks.size() && state_->tracks[tid] != track) ++tid;
  if (tid == state_->tracks.size()) {
    state_->tracks.push_back(track);
    state_->events.push_back(
        fmt::format(R"({{"name":"thread_name","ph":"M","pid":{},"tid":{},"args":{{"name":"{}"}}}})",
                    state_->rank, tid, json_escape(track)));
  }
  state_->events.push_back(fmt::format(
      R"({{"name":"{}","cat":"{}","ph":"X","pid":{},"tid":{},"ts":{:.1f},"dur":{:.1f}{}}})",
      json_escape(name), json_escape(track), state_->rank, tid, us(start), us(end) - us(start),
      args_json.empty() ? std::string() : ",\"args\":" + args_json));
}

void Timeline::flush() {
  std::lock_guard lock(state_->mutex);
  FILE* f = std::fopen(state_->path.c_str(), "w");
  if (f == nullptr) {
    DTRAIN_LOG_WARN("timeline: cannot write {} (DTRAIN_TIMELINE): {}", state_->path,
                    std::strerror(errno));
    return;
  }
  std::fprintf(
      f, "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}",
      state_->rank, state_->rank);
  for (const auto& e : state_->events) std::fprintf(f, ",\n%s", e.c_str());
  std::fprintf(f, "\n]\n");
  // The buffered tail is written by fclose: a full disk shows up there.
  const bool failed = std::ferror(f) != 0;
  if (std::fclose(f) != 0 || failed) {
    DTRAIN_LOG_WARN("timeline: writing {} (DTRAIN_TIMELINE) failed: {}", state_->path,
                    std::strerror(errno));
    return;
  }
  state_->written = true;
}

}  // namespace dtrain
