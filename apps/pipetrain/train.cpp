// `pipetrain train`: the flags fill a JobConfig (job_flags.h), the library runs it
// (job::run_training, job/run_job.h) and the console observer prints what it hears.
//
// `--resume DIR` alone continues the job DIR/job.toml describes (the run that wrote DIR's
// checkpoints); with other flags or a --config file, those describe the job, as before.
//
// Exit codes (commands.h): 0 done, 1 failure while training (a step threw, the loss is not
// finite: the message names the step), 2 bad usage or bad input.
#include <iostream>

#include "commands.h"
#include "job_flags.h"
#include "pipetrain/job/console_observer.h"
#include "pipetrain/job/job_file.h"
#include "pipetrain/job/run_job.h"
#include "pipetrain/train/finite_loss.h"

namespace pipetrain::cli {
namespace {

int run_train(JobCommand& command) {
  const std::vector<std::string> given = given_flags(*command.app);
  if (given.size() == 1 && given.front() == "--resume" && command.config_file.empty()) {
    command.config = job::job_of_checkpoint(command.config.checkpoint.resume);
  }
  apply_deepspeed_config(command);
  if (print_config_if_asked(command)) return 0;
  job::ConsoleObserver console;
  try {
    return job::run_training(command.config, console).exit_code;
  } catch (const train::NonFiniteLossError& error) {
    std::cerr << "pipetrain train: " << error.what() << "\n";
    return 1;
  }
}

}  // namespace

void add_train_command(CLI::App& app, int& exit_code) {
  auto* command = app.add_subcommand(
      "train",
      "train a model, pipelined: example models on Fashion-MNIST or text, a Hugging Face model on "
      "token ids or documents, or a TorchScript model on saved tensors (docs/QUICKSTART.md, "
      "docs/TRAIN_CLI.md)");
  std::shared_ptr<JobCommand> job = add_job_flags(*command, job::Command::kTrain);
  command->callback([job, &exit_code] { exit_code = run_train(*job); });
}

}  // namespace pipetrain::cli
