// Pieces of logical tensors (docs/formats.md, "Checkpoint directories"): how the part of a
// parameter one rank holds (a tensor-parallel piece, a ZeRO range of the flat buffer, or
// both) maps to blocks ("boxes") of the logical tensor, so that sharded checkpoints store
// logical tensors and any layout can be rebuilt from them.
// Thread-safety: pure functions.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/params.h"
#include "loom/core/tensor.h"

namespace loom::checkpoint {

// Elements [offsets[d], offsets[d] + extents[d]) along every dimension d of a tensor.
struct Box {
  Shape offsets, extents;
  int64_t numel() const;
  bool operator==(const Box&) const = default;
};

// The common elements of a and b (same rank); extents all zero when none.
Box intersect(const Box& a, const Box& b);
bool empty(const Box& b);

// The boxes of `shape` covering its row-major element range [begin, end), in that order:
// at most 2 x rank - 1 of them. REQUIRES: 0 <= begin <= end <= numel(shape).
std::vector<Box> range_boxes(const Shape& shape, int64_t begin, int64_t end);

// For a box of parameter p's piece (p.shape), the boxes of the logical tensor
// (p.global_shape) it holds, each with the box of the piece it comes from (same extents).
// A parameter that is not split maps to itself.
std::vector<std::pair<Box, Box>> logical_boxes(const ParamInfo& p, const Box& local);

// Copies the block `extents` of src (shape src_shape) starting at src_at into dst (shape
// dst_shape) at dst_at; elements of elem_bytes bytes, row-major, contiguous.
void copy_box(const void* src, const Shape& src_shape, const Shape& src_at, void* dst, const Shape& dst_shape,
              const Shape& dst_at, const Shape& extents, size_t elem_bytes);

// A range [begin, end) of a buffer laid out as a ParamSet's values (the values, or an
// optimizer buffer of the same layout), `data` pointing at its element `begin`.
struct FlatRun {
  int64_t begin = 0, end = 0;
  const void* data = nullptr;
};

// One box of a logical tensor with its elements: `data` (contiguous, shape box.extents), or
// for a piece made in place, `fill`, which writes them to a buffer of nbytes() when asked,
// from the buffer the piece was made from (which must not change until then).
struct Piece {
  std::string name;  // the logical tensor's
  Shape shape;       // the logical tensor's
  Box box;
  Tensor data;
  std::function<void(void* dst)> fill;
  DType fill_dtype = DType::kF32;
  DType dtype() const { return data.defined() ? data.dtype() : fill_dtype; }
  size_t nbytes() const { return static_cast<size_t>(box.numel()) * dtype_size(dtype()); }
};

// Where pieces' data goes: one allocation in huge pages, handed out in turn, and kept from
// one save to the next (reused when nothing else holds it and it is large enough), so that
// copying a share faults no pages after the first save.
class PieceArena {
 public:
  // Makes room for `bytes` in all, reusing the allocation when it can. `touch`: writes every
  // page now (at start, so that the first save's copy does not wait for the kernel to find
  // and zero huge pages).
  void reserve(size_t bytes, bool touch = false);
  // The next `shape` of `dtype`. REQUIRES: room reserved.
  Tensor take(const Shape& shape, DType dtype);

 private:
  std::shared_ptr<Storage> storage_;
  size_t used_ = 0, reserved_ = 0;
};

// The pieces `runs` hold (ascending, disjoint ranges of a buffer laid out as `params`, of
// params.dtype()), named prefix + parameter name, in flat order; their data copied into
// `arena` (room reserved by the caller), or into an allocation of their own.
std::vector<Piece> pieces(const ParamSet& params, const std::vector<FlatRun>& runs, const std::string& prefix = "",
                          PieceArena* arena = nullptr);
// The same pieces made in place: each copies its elements from the runs only when written
// (Piece::fill), so that a checkpoint written at once needs no copy of what it saves.
std::vector<Piece> pieces_in_place(const ParamSet& params, const std::vector<FlatRun>& runs,
                                   const std::string& prefix = "");

}  // namespace loom::checkpoint
