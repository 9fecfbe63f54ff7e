// `dtrain docs`: the documentation, wherever dtrain was installed from (CMake's install and pip's
// wheel put it in PREFIX/share/dtrain/docs; a build tree reads the source tree's docs/).
//   dtrain docs                 # the topics, each with its title
//   dtrain docs data            # docs/data.md
//   dtrain docs --path          # the folder, for a Markdown viewer
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "tools/dtrain/commands.h"
#include "tools/dtrain/share_dir.h"
#include "tools/dtrain/spelling.h"

namespace dtrain::tools {
namespace {

namespace fs = std::filesystem;

struct DocsFlags {
  std::string topic;
  bool path = false;
};

std::string docs_dir() { return share_dir("docs", "architecture.md", DTRAIN_SOURCE_DOCS_DIR); }

std::vector<std::string> topics(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".md") names.push_back(entry.path().stem().string());
  if (ec || names.empty())
    throw InvalidArgumentError(fmt::format(
        "dtrain docs: no documentation in {}{}: reinstall dtrain, or read it at the source tree's "
        "docs/",
        dir, ec ? " (" + ec.message() + ")" : ""));
  std::sort(names.begin(), names.end());
  return names;
}

// The first heading of a Markdown file, without its '#'s.
std::string title(const fs::path& file) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("# ", 0) == 0) return line.substr(2);
  return "";
}

void run_docs(const DocsFlags& f) {
  const std::string dir = docs_dir();
  if (f.path) {
    std::printf("%s\n", dir.c_str());
    return;
  }
  const std::vector<std::string> names = topics(dir);
  if (f.topic.empty()) {
    std::printf("dtrain docs TOPIC prints one (Markdown; the files are in %s):\n\n", dir.c_str());
    for (const std::string& name : names)
      std::printf("  %-20s %s\n", name.c_str(), title(fs::path(dir) / (name + ".md")).c_str());
    return;
  }
  std::string topic = f.topic;
  if (topic.size() > 3 && topic.ends_with(".md")) topic.resize(topic.size() - 3);
  if (std::find(names.begin(), names.end(), topic) == names.end()) {
    const auto near = closest(topic, names);
    throw InvalidArgumentError(
        fmt::format("dtrain docs: no topic '{}'{}; `dtrain docs` lists them", f.topic,
                    near ? fmt::format(" (did you mean {}?)", *near) : std::string()));
  }
  std::ifstream in(fs::path(dir) / (topic + ".md"), std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::fwrite(text.data(), 1, text.size(), stdout);
}

}  // namespace

CLI::App* add_docs_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "docs", "Print the documentation: `dtrain docs` lists the topics, `dtrain docs data` one");
  auto f = std::make_shared<DocsFlags>();
  cmd->add_option("topic", f->topic, "A topic (data, pytorch, troubleshooting, ...)");
  cmd->add_flag("--path", f->path, "Print the folder that holds the documentation");
  cmd->callback([f] { run_docs(*f); });
  return cmd;
}

}  // namespace dtrain::tools
