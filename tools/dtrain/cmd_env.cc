// `dtrain env`: prints every environment variable dtrain reads, its default and its current
// value, as the Markdown table docs/env.md holds (`dtrain env --markdown`).
#include <cstdio>
#include <memory>
#include <string_view>

#include <fmt/format.h>

#include "common/env.h"
#include "tools/dtrain/commands.h"

namespace dtrain::tools {

CLI::App* add_env_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("env", "List the environment variables dtrain reads");
  auto markdown = std::make_shared<bool>(false);
  cmd->add_flag("--markdown", *markdown,
                "Print the table in Markdown, as `dtrain docs env` shows it");
  cmd->callback([markdown] {
    if (*markdown) {
      fmt::print("| variable | default | meaning |\n|---|---|---|\n");
      for (const auto& v : env::all())
        fmt::print(
            "| `{}` | {} | {} |\n", v.name,
            v.default_value.empty() ? std::string("(unset)") : fmt::format("`{}`", v.default_value),
            v.help);
      return;
    }
    for (const auto& v : env::all()) {
      auto value = env::raw(v);
      // A secret is shown as set, never its value: `dtrain env` output lands in logs and issues.
      if (value && std::string_view(v.name).ends_with("_TOKEN"))
        value = fmt::format("(set, {} characters)", value->size());
      fmt::print(
          "{:<28} {:<10} {}\n", v.name,
          value ? *value : fmt::format("({})", v.default_value.empty() ? "unset" : v.default_value),
          v.help);
    }
  });
  return cmd;
}

}  // namespace dtrain::tools
