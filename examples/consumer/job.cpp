// Concept: the job as a library value (job/job_config.h, job/run_job.h). A JobConfig filled in
// code -- a small Hugging Face Llama, documents with a loss mask, 2 pipeline x 2 data-parallel
// processes with ZeRO-1 -- run by job::run_training with an observer of this program's own, as
// `pipetrain train` runs the same job from its flags.
//
//   python save_hf_llama.py DIR       transformers' save_pretrained of a tiny Llama
//   ./job DIR WORK PIPETRAIN          WORK: a new directory; PIPETRAIN: the installed CLI
//
// The program writes WORK/docs (a Megatron indexed dataset: DIR/tokens.bin cut into documents) and
// its loss mask WORK/docs_loss_mask (io/indexed_dataset.h), then trains. With parallel.nproc 4
// run_training starts this program 4 times again as the ranks (same arguments, so the same
// JobConfig); each rank finds the launcher's environment, runs its share and returns. Then it runs
// `PIPETRAIN train` with the same job as flags.
//
// Check: both runs wrote the model (output.save_hf) and the two are equal bit for bit; the
// observer heard every step on the main rank and the loss fell.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <pipetrain/io/indexed_dataset.h>
#include <pipetrain/io/safetensors.h>
#include <pipetrain/io/token_file.h>
#include <pipetrain/job/job_config.h>
#include <pipetrain/job/job_observer.h>
#include <pipetrain/job/run_job.h>
#include <pipetrain/runtime/distributed.h>
#include <torch/torch.h>

namespace io = pipetrain::io;
namespace job = pipetrain::job;

namespace {

// This program's own report: a line per step and the result, nothing else.
class StepCounter : public job::JobObserver {
 public:
  void on_step(const pipetrain::train::StepReport& r) override {
    if (first_loss < 0) first_loss = r.loss;
    last_loss = r.loss;
    ++steps;
    std::printf("step %lld: loss %.4f\n", static_cast<long long>(r.step), r.loss);
  }
  void on_note(const job::Note& note) override { std::printf("(%s)\n", note.text.c_str()); }
  void on_done(const job::TrainingDone& done) override {
    std::printf("trained %lld steps, loss %.4f -> %.4f\n",
                static_cast<long long>(done.summary.steps), done.summary.first_loss,
                done.summary.last_loss);
    // The main rank checks what it heard: every step, and a loss that fell.
    heard_every_step = steps == done.summary.steps && last_loss < first_loss;
  }
  int64_t steps = 0;
  double first_loss = -1, last_loss = 0;
  bool heard_every_step = true;  // stays true in processes that hear no steps
};

// The model directory's token stream (save_hf_llama.py writes it) cut into 48 documents of 5 to
// 40 ids; the mask learns all but the first quarter of each document (a "prompt").
void write_documents(const std::string& prefix, const std::string& model) {
  const io::TokenFile tokens(model + "/tokens.bin", 2);
  std::vector<std::vector<int64_t>> documents, masks;
  int64_t at = 0;
  for (int d = 0; d < 48; ++d) {
    const int64_t length = 5 + (d * 13) % 36;
    std::vector<int64_t> ids, mask;
    for (int64_t i = 0; i < length; ++i) {
      ids.push_back(tokens.at(at++ % tokens.tokens()));
      mask.push_back(i < length / 4 ? 0 : 1);
    }
    documents.push_back(std::move(ids));
    masks.push_back(std::move(mask));
  }
  io::write_indexed_dataset(prefix, documents, io::IndexedDtype::kUint16);
  io::write_indexed_dataset(prefix + "_loss_mask", masks, io::IndexedDtype::kUint8);
}

// The job, in code. Every field has the CLI's default; these are the ones this job sets.
job::JobConfig the_job(const std::string& model, const std::string& work) {
  job::JobConfig c;
  c.model.name = model;
  c.data.name = "indexed";
  c.data.path = {work + "/docs"};
  c.data.loss_mask_path = {work + "/docs_loss_mask"};
  c.data.seq_len = 16;
  c.training.batch_size = 8;
  c.training.steps = 6;
  c.training.log_every = 1;
  c.optimizer.name = "adamw";
  c.optimizer.lr = 0.01;
  c.parallel.nproc = 4;
  c.parallel.pp = 2;
  c.parallel.dp = 2;
  c.zero.stage = 1;
  c.pipeline.chunks = "2";
  c.output.save_hf = work + "/by-library";
  return c;
}

// The same job as `pipetrain train`'s flags.
std::string as_flags(const std::string& model, const std::string& work) {
  return "train --model " + model + " --data indexed --data-path " + work +
         "/docs --loss-mask-path " + work +
         "/docs_loss_mask --seq-len 16 --batch-size 8 --steps 6 --log-every 1 --optimizer adamw "
         "--lr 0.01 --nproc 4 --pp 2 --dp 2 --zero 1 --chunks 2 --save-hf " +
         work + "/by-cli";
}

bool same_files(const std::string& a, const std::string& b) {
  const io::SafetensorsCheckpoint left = io::SafetensorsCheckpoint::open(a);
  const io::SafetensorsCheckpoint right = io::SafetensorsCheckpoint::open(b);
  if (left.names() != right.names() || left.names().empty()) {
    std::printf("%s and %s hold different tensors\n", a.c_str(), b.c_str());
    return false;
  }
  for (const std::string& name : left.names()) {
    if (!torch::equal(left.load(name, torch::kFloat32), right.load(name, torch::kFloat32))) {
      std::printf("%s differs between %s and %s\n", name.c_str(), a.c_str(), b.c_str());
      return false;
    }
  }
  std::printf("%zu tensors equal bit for bit\n", left.names().size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s MODEL_DIR WORK_DIR PIPETRAIN_CLI\n", argv[0]);
    return 2;
  }
  const std::string model = argv[1], work = argv[2], cli = argv[3];
  const bool rank = pipetrain::DistributedEnvironment::present();
  if (!rank) {
    std::filesystem::create_directories(work);
    write_documents(work + "/docs", model);
  }
  StepCounter observer;
  const job::JobResult result = job::run_training(the_job(model, work), observer);
  if (rank) return result.exit_code == 0 && observer.heard_every_step ? 0 : 1;
  if (result.exit_code != 0) return result.exit_code;
  const std::string command = "'" + cli + "' " + as_flags(model, work);
  std::printf("$ %s\n", command.c_str());
  std::fflush(stdout);
  if (std::system(command.c_str()) != 0) return 1;
  return same_files(work + "/by-library", work + "/by-cli") ? 0 : 1;
}
