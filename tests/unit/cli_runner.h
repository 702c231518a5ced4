// Runs the moetier CLI (MOETIER_BIN) from a test and captures its exit status
// (or the signal that killed it), stdout and stderr. Header-only; the one
// runner of every CLI test.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace moetier::testutil {

struct CliResult {
  int rc = -1;     // exit status, -1 when killed by a signal
  int signal = 0;  // the signal that killed it, 0 when it exited
  std::string out, err;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Single-quotes s for /bin/sh.
inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// `env moetier args`: env is a prefix of VAR=value assignments (may be empty).
// The shell execs the binary, so a signal that kills it is seen as such.
inline CliResult run_cli(const std::string& args, const std::string& env = "") {
  namespace fs = std::filesystem;
  static int counter = 0;
  fs::path dir = fs::temp_directory_path() /
                 ("moetier_cli_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::create_directories(dir);
  std::string cmd = env + " exec " + MOETIER_BIN + " " + args + " >" + (dir / "out").string() +
                    " 2>" + (dir / "err").string();
  const int status = std::system(cmd.c_str());
  CliResult r;
  if (WIFEXITED(status)) r.rc = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  r.out = slurp(dir / "out");
  r.err = slurp(dir / "err");
  fs::remove_all(dir);
  return r;
}

}  // namespace moetier::testutil
