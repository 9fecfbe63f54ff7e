// `dtrain algorithms`: every collective algorithm dtrain has, its cost formula and when the cost
// model picks it, from the registry (comm/algorithms/algorithm.h); `--markdown` prints the table
// of docs/algorithms.md, which a test keeps equal to it.
#include <memory>

#include <fmt/format.h>

#include "comm/algorithms/algorithm.h"
#include "tools/dtrain/commands.h"

namespace dtrain::tools {

CLI::App* add_algorithms_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("algorithms", "List the collective algorithms and their costs");
  auto markdown = std::make_shared<bool>(false);
  cmd->add_flag("--markdown", *markdown,
                "Print the table in Markdown, as `dtrain docs algorithms` shows it");
  cmd->callback([markdown] {
    if (*markdown) {
      fmt::print("{}", comm::algo::markdown_table());
      return;
    }
    for (const comm::algo::Algorithm* a : comm::algo::registry())
      fmt::print("{:<15} {:<19} {}\n{:<35} chosen: {}\n", comm::to_string(a->kind), a->name,
                 a->formula, "", a->chosen);
  });
  return cmd;
}

}  // namespace dtrain::tools
