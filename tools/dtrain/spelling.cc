#include "tools/dtrain/spelling.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/error.h"

namespace dtrain::tools {
namespace {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// Options of `dtrain run` that take a value: the token after them is not the worker command.
bool is_flag(const CLI::App& run, std::string_view token) {
  for (const CLI::Option* option : run.get_options())
    if (option->check_name(std::string(token))) return option->get_type_size() == 0;
  return false;
}

}  // namespace

std::optional<std::string> closest(std::string_view word,
                                   const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  size_t best_distance = std::max<size_t>(2, word.size() / 3) + 1;  // a third of it, or 2
  for (const auto& candidate : candidates) {
    size_t d = edit_distance(word, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best;
}

std::vector<std::string> option_spellings(const CLI::App& command) {
  std::vector<std::string> names;
  for (const CLI::Option* option : command.get_options()) {
    for (const auto& n : option->get_lnames()) names.push_back("--" + n);
    for (const auto& n : option->get_snames()) names.push_back("-" + n);
  }
  return names;
}

void check_spelling(const CLI::App& app, int argc, const char* const* argv) {
  if (argc < 2) return;
  std::string_view first = argv[1];
  std::vector<std::string> commands;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    commands.push_back(sub->get_name());
  if (!first.starts_with("-") &&
      std::find(commands.begin(), commands.end(), first) == commands.end()) {
    auto near = closest(first, commands);
    throw InvalidArgumentError(
        fmt::format("unknown command '{}'{}: the commands are {} (dtrain --help)", first,
                    near ? fmt::format(" (did you mean '{}'?)", *near) : std::string(),
                    fmt::join(commands, ", ")));
  }
  // A command of commands (`dtrain data write`): the same for its word.
  if (!first.starts_with("-")) {
    const CLI::App* command = app.get_subcommand(std::string(first));
    std::vector<std::string> inner;
    for (const CLI::App* sub : command->get_subcommands([](const CLI::App*) { return true; }))
      inner.push_back(sub->get_name());
    if (!inner.empty()) {
      if (argc < 3)
        throw InvalidArgumentError(fmt::format("dtrain {} needs a command: {} (dtrain {} --help)",
                                               first, fmt::join(inner, ", "), first));
      const std::string_view second = argv[2];
      if (!second.starts_with("-") &&
          std::find(inner.begin(), inner.end(), second) == inner.end()) {
        auto near = closest(second, inner);
        throw InvalidArgumentError(fmt::format(
            "unknown command '{} {}'{}: the {} commands are {} (dtrain {} --help)", first, second,
            near ? fmt::format(" (did you mean '{}'?)", *near) : std::string(), first,
            fmt::join(inner, ", "), first));
      }
    }
  }
  if (first != "run") return;
  const CLI::App& run = *app.get_subcommand("run");
  // Up to the worker command: "--", or a word that is not the value of an option.
  bool value_expected = false;
  for (int i = 2; i < argc; ++i) {
    std::string_view token = argv[i];
    if (token == "--") return;
    if (!token.starts_with("-")) {
      if (!value_expected) return;
      value_expected = false;
      continue;
    }
    if (token == "-np" || token.starts_with("-np=")) {
      throw InvalidArgumentError(
          "dtrain run: -np is mpirun's spelling; dtrain run takes -n (or --nproc-per-node, "
          "--nproc_per_node): dtrain run -n 2 -- ./train");
    }
    value_expected = token.find('=') == std::string_view::npos && !is_flag(run, token);
  }
}

}  // namespace dtrain::tools
