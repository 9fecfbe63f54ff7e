// launch::spawn, the one fork and exec of the launcher, the local queue and the memory probe: the
// child's environment, directory, output and process group as asked; a program that cannot
// start said why, with exit status 127; a detached child in a session of its own, nobody's here;
// a child started at the idle CPU priority and raised again (launch/idle_priority.h).
#include "launch/spawn.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "dtrain/error.h"
#include "launch/cpu_binding.h"
#include "launch/idle_priority.h"

namespace dtrain::launch {
namespace {

namespace fs = std::filesystem;

fs::path scratch() {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       ("spawn_" + std::to_string(::getpid()) + "_" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

int exit_status(pid_t pid) {
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Spawn, TheChildGetsItsEnvironmentDirectoryAndOutput) {
  const fs::path dir = scratch();
  ::setenv("DTRAIN_SPAWN_TEST_INHERITED", "kept", 1);
  const Spawned s = spawn({.path = "/bin/sh",
                           .argv = {"sh", "-c",
                                    "echo $A $B $DTRAIN_SPAWN_TEST_INHERITED; pwd; "
                                    "echo to-stderr >&2; exit 3"},
                           .env = {{"A", "first"}, {"B", "b"}, {"A", "second"}},
                           .cwd = dir.string(),
                           .output_file = (dir / "out").string()});
  ASSERT_TRUE(s.failure.empty()) << s.failure;
  EXPECT_EQ(exit_status(s.pid), 3);
  EXPECT_EQ(read_file(dir / "out"), "second b kept\n" + dir.string() + "\nto-stderr\n");

  // Only what it is given.
  const Spawned only = spawn({.path = "/bin/sh",
                              .argv = {"sh", "-c", "echo \"[$DTRAIN_SPAWN_TEST_INHERITED] $A\""},
                              .env = {{"A", "a"}},
                              .inherit_environment = false,
                              .output_file = (dir / "only").string()});
  EXPECT_EQ(exit_status(only.pid), 0);
  EXPECT_EQ(read_file(dir / "only"), "[] a\n");
}

TEST(Spawn, AProgramThatCannotStartIsSaidWhyAndExits127) {
  const fs::path dir = scratch();
  std::ofstream(dir / "not-executable") << "#!/bin/sh\n";
  Spawned s = spawn({.path = (dir / "not-executable").string(), .argv = {"not-executable"}});
  EXPECT_EQ(s.failure,
            "cannot execute " + (dir / "not-executable").string() + ": Permission denied");
  EXPECT_EQ(exit_status(s.pid), 127);

  s = spawn({.path = "/bin/true", .argv = {"true"}, .cwd = (dir / "none").string()});
  EXPECT_EQ(s.failure, "cannot enter the directory " + (dir / "none").string() +
                           ": No such file or directory");
  EXPECT_EQ(exit_status(s.pid), 127);

  EXPECT_THROW(find_executable("dtrain-no-such-program"), InvalidArgumentError);
  EXPECT_EQ(find_executable("sh").back(), 'h');
}

TEST(Spawn, TheChildLeadsItsOwnProcessGroup) {
  const Spawned s = spawn({.path = "/bin/sleep", .argv = {"sleep", "30"}});
  ASSERT_TRUE(s.failure.empty()) << s.failure;
  EXPECT_EQ(::getpgid(s.pid), s.pid);
  ::kill(-s.pid, SIGKILL);  // the whole group
  int status = 0;
  ASSERT_EQ(::waitpid(s.pid, &status, 0), s.pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

TEST(Spawn, AChildStartedAtTheIdlePriorityIsRaisedToTheNormalOne) {
  if (!can_leave_idle_priority())
    GTEST_SKIP() << "this process may not raise a thread from SCHED_IDLE (no CAP_SYS_NICE)";
  const Spawned s = spawn({.path = "/bin/sleep", .argv = {"sleep", "30"}, .idle_priority = true});
  ASSERT_TRUE(s.failure.empty()) << s.failure;
  // The child sets its policy between fork and exec.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (::sched_getscheduler(s.pid) != SCHED_IDLE && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(::sched_getscheduler(s.pid), SCHED_IDLE);
  EXPECT_EQ(leave_idle_priority(s.pid), "");
  EXPECT_EQ(::sched_getscheduler(s.pid), SCHED_OTHER);
  ::kill(-s.pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(s.pid, &status, 0), s.pid);
  EXPECT_NE(leave_idle_priority(s.pid), "");  // gone: it says so
}

TEST(Spawn, ARunningChildIsBoundEveryThreadToTheCpusGiven) {
  const std::vector<int> cpus = allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  const Spawned s = spawn({.path = "/bin/sleep", .argv = {"sleep", "30"}});
  ASSERT_TRUE(s.failure.empty()) << s.failure;
  EXPECT_EQ(bind_every_thread(s.pid, {cpus.back()}), "");
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(s.pid, sizeof set, &set), 0);
  EXPECT_EQ(CPU_COUNT(&set), 1);
  EXPECT_TRUE(CPU_ISSET(cpus.back(), &set));
  ::kill(-s.pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(s.pid, &status, 0), s.pid);
  EXPECT_NE(bind_every_thread(s.pid, cpus), "");  // gone: it says so
}

TEST(Spawn, ADetachedChildHasItsOwnSessionAndIsNotOurs) {
  const fs::path dir = scratch();
  const Spawned s = spawn({.path = "/bin/sh",
                           .argv = {"sh", "-c",
                                    "echo $$ $PPID $(cut -d' ' -f6 /proc/$$/stat) > "
                                    "ids.tmp && mv ids.tmp ids"},
                           .cwd = dir.string(),
                           .detach = true});
  ASSERT_TRUE(s.failure.empty()) << s.failure;
  EXPECT_EQ(s.pid, -1);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!fs::exists(dir / "ids") && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::istringstream ids(read_file(dir / "ids"));
  pid_t pid = 0, parent = 0, session = 0;
  ASSERT_TRUE(ids >> pid >> parent >> session) << read_file(dir / "ids");
  EXPECT_NE(session, ::getsid(0)) << "still in this process's session";
  EXPECT_NE(parent, ::getpid());
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1) << "a child left to reap";
}

}  // namespace
}  // namespace dtrain::launch
