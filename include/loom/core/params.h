// ParamSet: every parameter of a model in one flat buffer, every gradient in a second one
// of the same layout (DESIGN.md section 3, STYLE.md rule 13). Parameters are registered
// by name and shape while a model is built, then allocate() creates both buffers; a
// ParamRef resolves to views into them. Offsets are element offsets in registration
// order, so data-parallel buckets and ZeRO shards are ranges of the flat buffers.
//
// Thread-safety: registration and allocate() from one thread; afterwards views may be
// used from any thread (disjoint writes are the caller's to arrange).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "loom/core/tensor.h"

namespace loom {

// What a parameter is, for optimizer policies such as "no weight decay on biases".
enum class ParamKind : uint8_t { kWeight, kBias, kNorm, kEmbedding };

// How a tensor-parallel parameter is cut from its logical tensor: along `dim`, which holds
// `groups` equal blocks (the fused q, k and v are 3), each cut into `parts` equal pieces;
// this process holds piece `index` of every block, the blocks' pieces side by side.
// dim < 0: not cut (the whole logical tensor, replicated).
struct ParamSplit {
  int dim = -1;
  int groups = 1;
  int index = 0;
  int parts = 1;
};

struct ParamInfo {
  std::string name;  // Hugging Face style, e.g. "transformer.h.0.attn.c_attn.weight"
  Shape shape;       // what this process holds
  ParamKind kind;
  int64_t offset;  // in elements, into the flat buffers
  int64_t numel;
  ParamSplit split;
  Shape global_shape;  // the logical tensor's
};

// Copies this process's piece of the logical tensor `whole` (global_shape) into `mine`
// (shape); the other way, puts it back. Same element type on both sides.
template <typename T>
void take_piece(const ParamInfo& p, const T* whole, T* mine);
template <typename T>
void put_piece(const ParamInfo& p, const T* mine, T* whole);

// Where a model is in a micro-step, reported block by block to whoever manages the blocks'
// parameters (data parallelism: ZeRO-3 gathers a block's parameters at kForward and
// kBackward and frees them after; gradient sums start at kBackwardDone). A model with
// blocks 0..L-1 owning the contiguous flat ranges [offsets[b], offsets[b+1]) reports:
//   forward:  (-1, kForward), then per block b ascending (b, kForward) (b, kForwardDone),
//             then (-1, kForwardDone) once its output is computed;
//   backward: (-1, kBackward), per block b descending (b, kBackward) (b, kBackwardDone),
//             then (-1, kBackwardDone).
// Block -1 is the rest (embeddings, final norm, head: the ranges before offsets[0] and
// after offsets[L]). Its parameters may be used at any point between (-1, kForward) and
// (-1, kForwardDone), and between (-1, kBackward) and (-1, kBackwardDone); the gradients
// after offsets[L] are final before the blocks' backward starts, the ones before
// offsets[0] only at (-1, kBackwardDone). So at (b, kBackwardDone) every gradient from
// offsets[b] on is final.
enum class BlockPhase : uint8_t { kForward, kForwardDone, kBackward, kBackwardDone };
using BlockHook = std::function<void(int block, BlockPhase phase)>;

class ParamSet;

class ParamRef {
 public:
  ParamRef() = default;
  ParamRef(const ParamSet* set, int index) : set_(set), index_(index) {}
  Tensor value() const;
  Tensor grad() const;
  const ParamInfo& info() const;
  bool defined() const { return set_ != nullptr; }

 private:
  const ParamSet* set_ = nullptr;
  int index_ = -1;
};

class ParamSet {
 public:
  explicit ParamSet(DType dtype = DType::kF32) : dtype_(dtype) {}
  ParamSet(const ParamSet&) = delete;
  ParamSet& operator=(const ParamSet&) = delete;

  // REQUIRES: not yet allocated; name unique. shape: what this process holds (split: its
  // piece of the logical tensor).
  ParamRef add(const std::string& name, const Shape& shape, ParamKind kind, ParamSplit split = {});
  void allocate();

  DType dtype() const { return dtype_; }
  int64_t numel() const { return numel_; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  int find(const std::string& name) const;  // -1 when absent
  ParamRef ref(int index) const { return ParamRef(this, index); }

  // The flat buffers, shape (numel,). REQUIRES: allocated.
  const Tensor& values() const { return values_; }
  const Tensor& grads() const { return grads_; }
  Tensor value(int index) const;
  Tensor grad(int index) const;
  void zero_grads() const { grads_.zero(); }
  // Moves the gradients into `g` (contiguous, numel() elements of dtype(); the values are
  // copied): data parallelism puts them where same-host peers read them in place.
  void adopt_grads(Tensor g);

 private:
  DType dtype_;
  std::vector<ParamInfo> infos_;
  int64_t numel_ = 0;
  Tensor values_;
  Tensor grads_;
};

}  // namespace loom
