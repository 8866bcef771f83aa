// A program of its own that trains its own model with tandem: a small CNN that finds which
// quadrant of a noisy 8x8 image holds a bright square. It registers the model and hands its
// command line to tandem's training front end, so it gets every flag of `tandem train`:
//
//   ./cnn_trainer --model cnn --steps 50 --lr 1e-2                        # one process
//   mpirun -np 2 ./cnn_trainer --model cnn --schedule 1f1b --stages 2     # a 2-stage pipeline
//   mpirun -np 4 ./cnn_trainer --model cnn --steps 50                     # profiled and planned
//   ./cnn_trainer profile --model cnn --microbatch-size 8
//
// Built against an installed tandem (CMakeLists.txt beside it: find_package(tandem)).
#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include <torch/nn/cloneable.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/container/any.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/torch/train_main.h"
#include "runtime/torch/data.h"
#include "runtime/torch/model.h"

ABSL_FLAG(int, cnn_channels, 8, "cnn: channels of its first convolution (the second has twice as many)");

namespace {

namespace libtorch = tandem::runtime::libtorch;

constexpr int64_t kImageSize = 8;
constexpr int64_t kSquare = 3;
constexpr int64_t kClasses = 4;  // the quadrant of the square's centre

// A 3x3 convolution and a ReLU, then optionally a 2x2 max-pool. Cloneable, as every layer must
// be (each pipeline stage holds its own copy).
struct ConvBlockImpl : torch::nn::Cloneable<ConvBlockImpl> {
  ConvBlockImpl(int64_t in, int64_t out, bool pool) : in(in), out(out), pool(pool) { reset(); }
  void reset() override {
    conv = register_module(
        "conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1)));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(conv(x));
    return pool ? torch::nn::functional::max_pool2d(
                      x, torch::nn::functional::MaxPool2dFuncOptions(2))
                : x;
  }
  int64_t in, out;
  bool pool;
  torch::nn::Conv2d conv{nullptr};
};
TORCH_MODULE(ConvBlock);

// Flattens its input and applies a linear map (and a ReLU unless it is the classifier).
struct DenseImpl : torch::nn::Cloneable<DenseImpl> {
  DenseImpl(int64_t in, int64_t out, bool relu) : in(in), out(out), relu(relu) { reset(); }
  void reset() override { linear = register_module("linear", torch::nn::Linear(in, out)); }
  torch::Tensor forward(torch::Tensor x) {
    x = linear(x.flatten(1));
    return relu ? torch::relu(x) : x;
  }
  int64_t in, out;
  bool relu;
  torch::nn::Linear linear{nullptr};
};
TORCH_MODULE(Dense);

// Sample j of iteration i: uniform noise in [0, 0.5) with a square of ones at a random place,
// drawn from a generator seeded by MixSeed(seed, i, j), so every rank makes any micro-batch on
// its own and a single process sees the same batches.
class SquaresData final : public libtorch::Dataset {
 public:
  explicit SquaresData(uint64_t seed) : seed_(seed) {}
  std::string name() const override { return "squares"; }
  absl::StatusOr<libtorch::Batch> Samples(int64_t iteration, int64_t first,
                                          int64_t count) const override {
    libtorch::Batch batch{torch::empty({count, 1, kImageSize, kImageSize}),
                          torch::empty({count}, torch::kInt64)};
    for (int64_t i = 0; i < count; ++i) {
      std::mt19937_64 random(libtorch::MixSeed(seed_, iteration, first + i));
      float* pixels = batch.inputs[i].data_ptr<float>();
      for (int64_t p = 0; p < kImageSize * kImageSize; ++p) {
        pixels[p] = static_cast<float>(random() >> 11) * 0x1.0p-53f * 0.5f;
      }
      const int64_t row = static_cast<int64_t>(random() % (kImageSize - kSquare + 1));
      const int64_t column = static_cast<int64_t>(random() % (kImageSize - kSquare + 1));
      for (int64_t r = row; r < row + kSquare; ++r) {
        for (int64_t c = column; c < column + kSquare; ++c) pixels[r * kImageSize + c] = 1.0f;
      }
      const int64_t centre_row = row + kSquare / 2, centre_column = column + kSquare / 2;
      batch.targets.data_ptr<int64_t>()[i] =
          (centre_row >= kImageSize / 2 ? 2 : 0) + (centre_column >= kImageSize / 2 ? 1 : 0);
    }
    return batch;
  }

 private:
  uint64_t seed_;
};

absl::StatusOr<tandem::cli::ModelAndData> MakeCnn(const tandem::cli::ModelRequest& request) {
  const int channels = absl::GetFlag(FLAGS_cnn_channels);
  if (channels < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--cnn-channels must be positive, got ",
                                                   channels));
  }
  tandem::cli::ModelAndData made;
  // Layer by layer: each rank builds only the layers of its stages.
  const int64_t c = channels, pooled = kImageSize / 4;
  made.spec = libtorch::LayerByLayerSpec(
      "cnn", {"conv1", "conv2", "dense", "classifier"},
      {[c] { return torch::nn::AnyModule(ConvBlock(1, c, /*pool=*/true)); },
       [c] { return torch::nn::AnyModule(ConvBlock(c, 2 * c, /*pool=*/true)); },
       [c] { return torch::nn::AnyModule(Dense(2 * c * pooled * pooled, 32, /*relu=*/true)); },
       [] { return torch::nn::AnyModule(Dense(32, kClasses, /*relu=*/false)); }},
      [](const torch::Tensor& logits, const torch::Tensor& targets) {
        return torch::nn::functional::cross_entropy(logits, targets);
      });
  made.data = std::make_shared<SquaresData>(request.seed);
  made.description = absl::StrCat("cnn channels=", channels);
  return made;
}

}  // namespace

int main(int argc, char** argv) {
  absl::Status registered = tandem::cli::RegisterModel(
      {.name = "cnn",
       .summary = "two convolutions (each pooled) and two linear layers on 8x8 images, 4 classes",
       .flags = {"cnn_channels"},
       .make = MakeCnn});
  if (!registered.ok()) return 2;
  return tandem::cli::TrainMain(argc, argv);
}
