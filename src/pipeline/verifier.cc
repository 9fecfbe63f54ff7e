// The verifier: each rank runs its list in order until it reaches a receive whose send has not run;
// sweeps over the ranks repeat until none can move. A pass starts when its rank is free, a receive
// when its send ran (plus the transfer), so the times do not depend on the order of the sweeps.
#include "dtrain/pipeline/verifier.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::pipeline {
namespace {

constexpr double kNotYet = -1;

// Per stage and micro-batch: when each event happened (kNotYet until it did).
struct Events {
  int m;
  std::vector<double> forward, backward, weight, sent_act, sent_grad, recv_act, recv_grad;
  // Whether the pass's backward was split (backward_input, then backward_weight): a schedule may
  // choose per pass (torch's DualPipeV does).
  std::vector<char> split;
  Events(int stages, int microbatches)
      : m(microbatches),
        forward(size_t(stages) * m, kNotYet),
        backward(forward),
        weight(forward),
        sent_act(forward),
        sent_grad(forward),
        recv_act(forward),
        recv_grad(forward),
        split(forward.size(), 0) {}
  static bool done(double t) { return t != kNotYet; }
  size_t at(const Action& a) const { return size_t(a.stage) * m + a.microbatch; }
  size_t at(int stage, int mb) const { return size_t(stage) * m + mb; }
};

std::string where(int rank, int index, const Action& a) {
  return fmt::format("rank {}, action {} ({})", rank, index, describe(a));
}

// The index of `target` in rank `rank`'s list, or -1.
int find_action(const Schedule& s, int rank, const Action& target) {
  const auto& list = s.actions[rank];
  auto it = std::find(list.begin(), list.end(), target);
  return it == list.end() ? -1 : static_cast<int>(it - list.begin());
}

}  // namespace

double cost_of(Op op, const Costs& c) {
  switch (op) {
    case Op::kForward:
      return c.forward;
    case Op::kBackward:
      return c.backward_input + c.backward_weight;
    case Op::kBackwardInput:
      return c.backward_input;
    case Op::kBackwardWeight:
      return c.backward_weight;
    default:
      return 0;
  }
}

ScheduleReport verify(const Schedule& s, const Costs& costs) {
  ScheduleReport report;
  const int p = s.ranks;
  const int stages = s.stages();
  const int m = s.microbatches;
  const int last = stages - 1;
  if (p < 1 || m < 1 || s.virtual_stages < 1 || static_cast<int>(s.actions.size()) != p) {
    report.error = fmt::format(
        "the schedule has {} ranks, {} micro-batches, {} virtual stages and "
        "action lists for {} ranks",
        p, m, s.virtual_stages, s.actions.size());
    return report;
  }
  if (int64_t{stages} * m > kMaxPasses) {
    report.error = fmt::format("{} stages x {} micro-batches is more than {} forward passes a step",
                               stages, m, kMaxPasses);
    return report;
  }
  Events ev(stages, m);
  std::vector<size_t> pc(p, 0);
  std::vector<double> clock(p, 0);
  std::vector<int> held(p, 0);
  report.busy.assign(p, 0);
  report.peak_microbatches.assign(p, 0);

  // Runs rank r's next action if it can. Returns false when it must wait (a receive whose send
  // has not run); sets report.error and returns false when the action is wrong.
  auto step = [&](int r) -> bool {
    const int index = static_cast<int>(pc[r]);
    const Action& a = s.actions[r][pc[r]];
    auto fail = [&](const std::string& why) {
      report.error = fmt::format("{}: {}", where(r, index, a), why);
      return false;
    };
    if (a.stage < 0 || a.stage > last)
      return fail(fmt::format("the stage is not one of the {} stages", stages));
    if (a.microbatch < 0 || a.microbatch >= m)
      return fail(fmt::format("the micro-batch is not one of the {}", m));
    if (s.rank_of(a.stage) != r)
      return fail(fmt::format("stage {} lives on rank {}", a.stage, s.rank_of(a.stage)));
    const size_t k = ev.at(a);
    double start = clock[r];
    switch (a.op) {
      case Op::kRecvActivation: {
        if (a.stage == 0) return fail("stage 0 receives no activation");
        if (Events::done(ev.recv_act[k])) return fail("received twice");
        const double sent = ev.sent_act[ev.at(a.stage - 1, a.microbatch)];
        if (!Events::done(sent)) return false;
        start = std::max(start, sent + costs.transfer);
        ev.recv_act[k] = start;
        break;
      }
      case Op::kRecvGradient: {
        if (a.stage == last)
          return fail("the last stage receives no gradient: its loss is its own");
        if (Events::done(ev.recv_grad[k])) return fail("received twice");
        const double sent = ev.sent_grad[ev.at(a.stage + 1, a.microbatch)];
        if (!Events::done(sent)) return false;
        start = std::max(start, sent + costs.transfer);
        ev.recv_grad[k] = start;
        break;
      }
      case Op::kForward:
        if (Events::done(ev.forward[k])) return fail("the forward runs twice");
        if (a.stage > 0 && !Events::done(ev.recv_act[k]))
          return fail("its input has not been received (no recv_activation before it)");
        ev.forward[k] = start + costs.forward;
        if (++held[r] > report.peak_microbatches[r]) report.peak_microbatches[r] = held[r];
        break;
      case Op::kBackward:
      case Op::kBackwardInput:
        if (Events::done(ev.backward[k])) return fail("the backward runs twice");
        if (!Events::done(ev.forward[k])) return fail("its forward has not run");
        if (a.stage < last && !Events::done(ev.recv_grad[k]))
          return fail("its output's gradient has not been received (no recv_gradient before it)");
        ev.backward[k] = start + cost_of(a.op, costs);
        ev.split[k] = a.op == Op::kBackwardInput;
        if (a.op == Op::kBackward) --held[r];
        break;
      case Op::kBackwardWeight:
        if (Events::done(ev.weight[k])) return fail("the weight gradient runs twice");
        if (!Events::done(ev.backward[k])) return fail("its backward_input has not run");
        if (!ev.split[k])
          return fail("its backward was whole (backward), which computed the weight gradient");
        ev.weight[k] = start + costs.backward_weight;
        --held[r];
        break;
      case Op::kSendActivation:
        if (a.stage == last) return fail("the last stage has no next stage to send to");
        if (Events::done(ev.sent_act[k])) return fail("sent twice");
        if (!Events::done(ev.forward[k])) return fail("its forward has not run");
        ev.sent_act[k] = start;
        break;
      case Op::kSendGradient:
        if (a.stage == 0) return fail("stage 0 has no previous stage to send a gradient to");
        if (Events::done(ev.sent_grad[k])) return fail("sent twice");
        if (!Events::done(ev.backward[k])) return fail("its backward has not run");
        ev.sent_grad[k] = start;
        break;
    }
    const double cost = cost_of(a.op, costs);
    report.timeline.push_back({r, index, a, start, start + cost});
    clock[r] = start + cost;
    report.busy[r] += cost;
    ++pc[r];
    return true;
  };

  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      while (pc[r] < s.actions[r].size()) {
        if (!step(r)) break;
        moved = true;
      }
      if (!report.error.empty()) return report;
    }
  }

  // Stuck: each waiting rank, and whether its send exists at all.
  std::vector<std::string> waiting;
  for (int r = 0; r < p; ++r) {
    if (pc[r] == s.actions[r].size()) continue;
    const Action& a = s.actions[r][pc[r]];
    const bool act = a.op == Op::kRecvActivation;
    const Action send{act ? Op::kSendActivation : Op::kSendGradient,
                      act ? a.stage - 1 : a.stage + 1, a.microbatch};
    const int peer = s.rank_of(send.stage);
    const int at = find_action(s, peer, send);
    std::string peer_state;
    if (at < 0) {
      peer_state = fmt::format("which rank {} never sends (a missing message)", peer);
    } else if (pc[peer] < s.actions[peer].size()) {
      peer_state = fmt::format(
          "which rank {} sends at its action {}, after its action {} ({}), "
          "where it waits",
          peer, at, pc[peer], describe(s.actions[peer][pc[peer]]));
    } else {
      peer_state = fmt::format("which rank {} sends at its action {}", peer, at);
    }
    waiting.push_back(
        fmt::format("{} waits for {}", where(r, static_cast<int>(pc[r]), a), peer_state));
  }
  if (!waiting.empty()) {
    // A message that is never sent is the cause; the ranks waiting behind it only its effect.
    std::vector<std::string> causes;
    for (const auto& w : waiting)
      if (w.find("never sends") != std::string::npos) causes.push_back(w);
    if (causes.empty()) {
      report.error = fmt::format("deadlock: {}", fmt::join(waiting, "; "));
    } else {
      const size_t behind = waiting.size() - causes.size();
      report.error =
          fmt::format("a receive has no send: {}{}", fmt::join(causes, "; "),
                      behind == 0   ? ""
                      : behind == 1 ? std::string("; 1 other rank waits behind it")
                                    : fmt::format("; {} other ranks wait behind it", behind));
    }
    return report;
  }

  // Ended: everything ran once, every send was received.
  for (int st = 0; st < stages; ++st) {
    const int r = s.rank_of(st);
    for (int i = 0; i < m; ++i) {
      const size_t k = ev.at(st, i);
      auto missing = [&](const char* what) {
        report.error =
            fmt::format("rank {} never runs the {} of micro-batch {} of stage {}", r, what, i, st);
      };
      if (!Events::done(ev.forward[k]))
        missing("forward");
      else if (!Events::done(ev.backward[k]))
        missing(s.split_backward() ? "backward_input" : "backward");
      else if (ev.split[k] && !Events::done(ev.weight[k]))
        missing("backward_weight");
      else if (st < last && Events::done(ev.sent_act[k]) &&
               !Events::done(ev.recv_act[ev.at(st + 1, i)]))
        report.error = fmt::format(
            "rank {} sends activation {} of stage {} (action {}) but rank {} "
            "never receives it",
            r, i, st, find_action(s, r, {Op::kSendActivation, st, i}), s.rank_of(st + 1));
      else if (st > 0 && Events::done(ev.sent_grad[k]) &&
               !Events::done(ev.recv_grad[ev.at(st - 1, i)]))
        report.error = fmt::format(
            "rank {} sends gradient {} of stage {} (action {}) but rank {} "
            "never receives it",
            r, i, st, find_action(s, r, {Op::kSendGradient, st, i}), s.rank_of(st - 1));
      if (!report.error.empty()) return report;
    }
  }
  report.makespan = *std::max_element(clock.begin(), clock.end());
  const double busy = std::accumulate(report.busy.begin(), report.busy.end(), 0.0);
  report.bubble = report.makespan > 0 ? 1 - busy / (p * report.makespan) : 0;
  report.ok = true;
  return report;
}

ScheduleReport check(const Schedule& schedule, const Costs& costs) {
  ScheduleReport r = verify(schedule, costs);
  if (!r.ok)
    throw InvalidArgumentError(fmt::format("pipeline schedule {} ({} ranks, {} micro-batches): {}",
                                           schedule.name, schedule.ranks, schedule.microbatches,
                                           r.error));
  return r;
}

}  // namespace dtrain::pipeline
