// trainsupd: the trainsup supervisor daemon (see supervisor/daemon.h).
//   trainsupd [--config FILE] [--check-config | --print-config |
//             --print-worker-binary] [--version]
// Without --config it reads ./trainsupd.toml when present, else runs on the
// built-in defaults (state in ./trainsup-state, one CPU slot).
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>

#include "contracts/daemon_config.h"
#include "contracts/version.h"
#include "supervisor/daemon.h"

int main(int argc, char** argv) {
  CLI::App app{"trainsupd: supervises sparse-convolution training workers"};
  std::string config_path;
  bool check_only = false;
  bool print_config = false;
  bool print_worker = false;
  bool version = false;
  app.add_option("--config", config_path, "configuration file (TOML)");
  app.add_flag("--check-config", check_only, "validate the configuration and exit");
  app.add_flag("--print-config", print_config,
               "print the configuration, every key with its value (defaults included), and exit");
  app.add_flag("--print-worker-binary", print_worker,
               "print the worker program this configuration launches, and exit");
  app.add_flag("--version", version, "print the version and exit");
  CLI11_PARSE(app, argc, argv);
  if (version) {
    std::cout << "trainsupd " << trainsup::Version() << "\n";
    return 0;
  }
  if (config_path.empty() && std::filesystem::exists("trainsupd.toml"))
    config_path = "trainsupd.toml";
  absl::StatusOr<trainsup::supervisor::DaemonConfig> config =
      config_path.empty()
          ? trainsup::supervisor::ParseConfig("", std::filesystem::current_path().string())
          : trainsup::supervisor::LoadConfig(config_path);
  if (!config.ok()) {
    std::cerr << "trainsupd: " << config.status().message() << "\n";
    return 64;
  }
  if (check_only) {
    std::cout << "configuration OK\n";
    return 0;
  }
  if (print_config) {
    std::cout << trainsup::supervisor::FormatConfig(*config);
    return 0;
  }
  if (print_worker) {
    std::error_code ec;
    std::cout << trainsup::supervisor::WorkerBinaryPath(
                     config->daemon, std::filesystem::read_symlink("/proc/self/exe", ec).string())
              << "\n";
    return 0;
  }
  auto log = spdlog::stderr_color_mt("trainsupd");
  // journald adds its own timestamps; a terminal or a file wants them.
  log->set_pattern(getenv("JOURNAL_STREAM") != nullptr ? "%l %v" : "%Y-%m-%dT%H:%M:%S.%f %l %v");
  log->info("trainsupd {} starting (config: {})", std::string(trainsup::Version()),
            config_path.empty() ? std::string("built-in defaults") : config_path);
  absl::StatusOr<std::unique_ptr<trainsup::supervisor::Daemon>> daemon =
      trainsup::supervisor::Daemon::Create(*config, config_path, log);
  if (!daemon.ok()) {
    log->critical("cannot start: {}", std::string(daemon.status().message()));
    return 1;
  }
  return (*daemon)->Run();
}
