// Hugging Face weights in and out of tandem's Llama and GPT-2 (runtime/torch/llama.h, gpt2.h).
//
// The layout. HfLayout lists every tensor a transformers checkpoint of a model holds: its key,
// tandem's parameter name for it and its shape, from the config alone (nothing is built). A
// tied model's checkpoint holds the embedding only; the head's copy (lm_parts.h TiedWeights)
// is named in `tied_copies` and takes the owner's tensor.
//
// In (`tandem train --model llama|gpt2 --init-from FOLDER`). HfWeights::Open checks a folder
// (model.safetensors, or shards and their index) against the layout once, from the index and
// the shards' headers only: every tensor present, no tensor the model does not use, every shape
// right, every dtype one that converts to float32 (F32, BF16, F16, F64). Then
// InitializeFromHfWeights makes the model's layer builder overwrite each layer it builds with
// the folder's tensors: a rank reads (through the memory map) the tensors of the layers it
// builds and no others (a tied head reads the embedding's tensor). Errors are InvalidArgument
// naming the folder and the key (NotFound for a folder with neither model.safetensors nor an
// index).
//
// Out (`tandem checkpoint export --format safetensors CKPT OUT`). ExportCheckpointToHf writes
// OUT/config.json and the parameters of a tandem checkpoint under transformers' keys
// (model.safetensors, or shards and an index past the shard size), float32, metadata
// {"format": "pt"}, a tied weight once, so that transformers' from_pretrained loads it without
// missing or unexpected keys. Everything is written into a hidden folder beside OUT and renamed
// to OUT at the end: an error leaves nothing behind. OUT must not exist or be an empty folder.
//
// The config of an export: --hf-config's file when given (it must describe the checkpoint's
// model: parsed, it gives the same description, seq_len aside), written as given with
// torch_dtype float32; otherwise generated from the model description the checkpoint records
// (DescribeLlama, DescribeGpt2), which holds every size and option but not the norm epsilon
// (written as tandem's default, 1e-5, the value of a model trained without --hf-config) nor,
// for Llama, max_position_embeddings (written as the sequence length, as `tandem train` sets it
// without --hf-config). A model trained from a config.json with another epsilon must be
// exported with that file as --hf-config.
//
// Thread safety: HfWeights may be read from several threads (SafetensorsFolder opens shards
// under a lock); layer building itself is single-threaded (model.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/json_util.h"

namespace tandem::formats {
class SafetensorsFolder;
}

namespace tandem::runtime::libtorch {

struct LlamaConfig;
struct Gpt2Config;
struct ModelSpec;

// One tensor of a model's transformers checkpoint. A parameter stored fused with others (Phi-3's
// qkv_proj and gate_up_proj, GraniteMoE's input_linear and output_linear) is rows
// [first_row, first_row + shape[0]) of its key's tensor of shape `key_shape`, every dimension
// but the last flattened into rows (a GraniteMoE expert's rows lie within its slice); several
// HfTensors then share the key, and export joins them by their rows.
struct HfTensor {
  std::string key;             // "model.layers.0.self_attn.q_proj.weight"
  std::string name;            // tandem's: "layers.1.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // as transformers stores it
  int64_t first_row = 0;
  std::vector<int64_t> key_shape;  // empty: the key's tensor is this parameter whole
  const std::vector<int64_t>& KeyShape() const { return key_shape.empty() ? shape : key_shape; }
};

struct HfLayout {
  std::string model;  // the model's description (DescribeLlama, DescribeGpt2), for messages
  std::vector<HfTensor> tensors;  // every tensor of the checkpoint, in layer order
  // Tied copies (tandem names): copy -> owner. The checkpoint holds the owner only.
  std::map<std::string, std::string> tied_copies;
  // tandem's name of a checkpoint key; InvalidArgument for a key that names no parameter. May
  // accept other spellings than `tensors`' keys (GPT-2 keys without "transformer.").
  std::function<absl::StatusOr<std::string>(absl::string_view key)> tandem_name;
  // Keys some checkpoints hold that name no parameter and that transformers ignores when it
  // loads (GPT-2's attention-mask buffers "h.<i>.attn.bias", "h.<i>.attn.masked_bias"). Empty:
  // none.
  std::function<bool(absl::string_view key)> ignored;

  // The tensor of parameter `name` (a tied copy's is its owner's); null for another name.
  const HfTensor* Find(absl::string_view name) const;
};

HfLayout LlamaHfLayout(const LlamaConfig& config);
HfLayout Gpt2HfLayout(const Gpt2Config& config);

// A transformers model folder checked against a layout (see the top of this file).
class HfWeights {
 public:
  static absl::StatusOr<std::shared_ptr<const HfWeights>> Open(const std::string& folder,
                                                               HfLayout layout);
  ~HfWeights();

  const std::string& folder() const { return folder_; }
  const HfLayout& layout() const { return layout_; }

  // Parameter `name`'s tensor (a tied copy: its owner's), converted to float32 into `out`
  // (`count` elements, the tensor's). InvalidArgument for a name the layout lacks.
  absl::Status ReadParameter(absl::string_view name, float* out, int64_t count) const;
  // Keys read so far, sorted (what this process's layers took from the folder).
  std::vector<std::string> KeysRead() const;

 private:
  HfWeights() = default;

  std::string folder_;
  HfLayout layout_;
  std::unique_ptr<formats::SafetensorsFolder> files_;
  // tandem name -> the folder's key, and the name's tensor in layout_.tensors (its rows of a
  // fused key).
  struct Source {
    std::string key;
    size_t tensor = 0;
  };
  std::map<std::string, Source, std::less<>> key_of_;
  mutable absl::Mutex mutex_;
  mutable std::set<std::string> read_ ABSL_GUARDED_BY(mutex_);
};

// Wraps `spec`'s layer builder: each layer, once built, has its parameters overwritten by the
// folder's tensors (converted to the parameters' dtype). A parameter the layout does not know
// or of another shape than the folder's tensor makes the build throw std::invalid_argument
// naming it (ModelSpec::BuildLayers reports it as InvalidArgument). `spec` must be built layer
// by layer.
void InitializeFromHfWeights(std::shared_ptr<const HfWeights> weights, ModelSpec* spec);

struct HfExportOptions {
  // A config.json to write; empty: the one `tandem train` recorded in the checkpoint
  // (HfConfigOfCheckpoint), else one generated from the checkpoint's model description.
  std::string hf_config;
  // Largest shard (bytes of tensors) before the weights are split with an index.
  int64_t max_shard_bytes = 5'000'000'000;
};

struct HfExportResult {
  std::string checkpoint;           // the step folder read
  std::string model;                // its model description
  std::vector<std::string> files;   // written into the output folder (config.json first)
  int64_t tensors = 0;              // written
  int64_t bytes = 0;                // of tensors
  // "--hf-config <path>", "the config.json recorded in the checkpoint" or "the model
  // description".
  std::string config_source;
};

// Writes the parameters of the checkpoint `checkpoint` (a root or a step folder) as a
// transformers folder `out_folder` (see the top of this file). InvalidArgument for a model that
// is not llama or gpt2, a description that cannot be read back (with the advice to pass
// --hf-config), a --hf-config of another model, a parameter missing from the checkpoint or one
// it holds that the model has not, a shape that differs, an `out_folder` that holds files;
// what reading the checkpoint returns (NotFound, DataLoss).
absl::StatusOr<HfExportResult> ExportCheckpointToHf(const std::string& checkpoint,
                                                    const std::string& out_folder,
                                                    const HfExportOptions& options = {});

// The config.json that sizes a checkpoint's model for an export or a generation, and where it
// came from.
struct CheckpointHfConfig {
  Json config;
  std::string source;  // "--hf-config PATH" or "the config.json recorded in the checkpoint"
};

// `hf_config` (--hf-config's path) read when given; else the config.json tandem train recorded
// in the checkpoint's manifest (its run record `run`, "hf_config"), when it describes the
// checkpoint's model `description` (a run whose flags changed the description, e.g. with
// --moe-aux-loss-coef, keeps to its description); nullopt otherwise: the description then
// sizes the model.
absl::StatusOr<std::optional<CheckpointHfConfig>> HfConfigOfCheckpoint(
    const std::string& description, const Json& run, const std::string& hf_config);

// What `config` (a llama's or a gpt2's config.json: the family `description` names) describes
// at the description's sequence length: DescribeLlama's or DescribeGpt2's text, which a
// checkpoint of that model records. InvalidArgument where the file cannot be read as one.
absl::StatusOr<std::string> DescribeHfConfig(const Json& config, absl::string_view description);

// `description` without its " seed=N".
std::string WithoutSeed(absl::string_view description);

// The sequence length a description records ("S=32"), 0 where none.
int64_t DescribedSequenceLength(absl::string_view description);

// The config a model description stands for (DescribeLlama's and DescribeGpt2's text; a
// trailing " seed=N" is ignored), fields the description lacks at the defaults above;
// InvalidArgument naming the token it cannot read. Exposed for tests.
absl::StatusOr<LlamaConfig> LlamaConfigFromDescription(absl::string_view description);
absl::StatusOr<Gpt2Config> Gpt2ConfigFromDescription(absl::string_view description);

}  // namespace tandem::runtime::libtorch
