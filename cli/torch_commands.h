// The subcommands that need LibTorch or the runtime (train, profile, checkpoint, generate) live
// in a second program, `tandem-torch`, built beside `tandem` in the same folder. `tandem` does
// not link LibTorch: it lists these commands with the summaries below and, to run one (flags,
// `--help` and all), replaces itself with `tandem-torch` and the same argv (exec: same process,
// environment and `mpirun` rank).
// So `tandem plan` and `tandem schedule` start in milliseconds, and `tandem train` pays for
// LibTorch only where it is used.
#pragma once

namespace tandem::cli {

// File name of the LibTorch program, looked up in the folder of the running `tandem`.
inline constexpr char kTorchProgram[] = "tandem-torch";

// One line each for `tandem --help`; the commands in cli/torch/ register the same text.
inline constexpr char kTrainSummary[] =
    "train a LibTorch model with the pipeline runtime (run under mpirun)";
inline constexpr char kProfileSummary[] =
    "measure a LibTorch model layer by layer and write profile.json";
inline constexpr char kCheckpointSummary[] =
    "inspect a checkpoint, compare two tensor by tensor, or export one as a Hugging Face "
    "folder (inspect DIR | diff A B | export --format safetensors DIR OUT)";
inline constexpr char kGenerateSummary[] =
    "continue a prompt with a gpt, gpt2 or llama checkpoint or Hugging Face folder (greedy or "
    "sampled, with a key/value cache)";

}  // namespace tandem::cli
