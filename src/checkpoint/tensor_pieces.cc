#include "loom/checkpoint/tensor_pieces.h"

#include <algorithm>
#include <cstring>

#include "loom/core/error.h"

namespace loom::checkpoint {

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t e : extents) n *= e;
  return n;
}

Box intersect(const Box& a, const Box& b) {
  LOOM_CHECK_EQ(a.offsets.size(), b.offsets.size());
  Box r{.offsets = Shape(a.offsets.size(), 0), .extents = Shape(a.offsets.size(), 0)};
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi = std::min(a.offsets[d] + a.extents[d], b.offsets[d] + b.extents[d]);
    if (hi <= lo) return {.offsets = Shape(a.offsets.size(), 0), .extents = Shape(a.offsets.size(), 0)};
    r.offsets[d] = lo;
    r.extents[d] = hi - lo;
  }
  return r;
}

bool empty(const Box& b) { return b.numel() == 0; }

namespace {

// Rows [row_begin, row_end) of dimension `dim` under the fixed `prefix` (one index per outer
// dimension), whole along every inner dimension.
Box rows(const Shape& shape, const Shape& prefix, int64_t row_begin, int64_t row_end) {
  Box b{.offsets = prefix, .extents = Shape(prefix.size(), 1)};
  b.offsets.push_back(row_begin);
  b.extents.push_back(row_end - row_begin);
  for (size_t d = prefix.size() + 1; d < shape.size(); ++d) {
    b.offsets.push_back(0);
    b.extents.push_back(shape[d]);
  }
  return b;
}

// The range [begin, end) of the sub-tensor at `prefix` (dimensions prefix.size() on).
void range_boxes_into(const Shape& shape, Shape& prefix, int64_t begin, int64_t end, std::vector<Box>& out) {
  if (begin >= end) return;
  const size_t dim = prefix.size();
  int64_t inner = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  auto within_row = [&](int64_t row, int64_t b, int64_t e) {
    prefix.push_back(row);
    range_boxes_into(shape, prefix, b, e, out);
    prefix.pop_back();
  };
  if (begin % inner == 0 && end % inner == 0) return out.push_back(rows(shape, prefix, begin / inner, end / inner));
  const int64_t first = begin / inner;
  if ((end - 1) / inner == first) return within_row(first, begin % inner, (end - 1) % inner + 1);
  int64_t full_begin = first;
  if (begin % inner != 0) {
    within_row(first, begin % inner, inner);
    full_begin = first + 1;
  }
  const int64_t full_end = end / inner;
  if (full_end > full_begin) out.push_back(rows(shape, prefix, full_begin, full_end));
  if (end % inner != 0) within_row(full_end, 0, end % inner);
}

// copy_box, with src's element i at src[i - src_bias] (a run that starts inside a tensor).
void copy_box_biased(const char* src, int64_t src_bias, const Shape& src_shape, const Shape& src_at, char* dst,
                     const Shape& dst_shape, const Shape& dst_at, const Shape& extents, size_t es) {
  const size_t rank = extents.size();
  for (int64_t e : extents)
    if (e == 0) return;
  if (rank == 0) {
    std::memcpy(dst, src - src_bias * static_cast<int64_t>(es), es);
    return;
  }
  Shape ss(rank, 1), ds(rank, 1);  // strides in elements
  for (size_t d = rank - 1; d-- > 0;) {
    ss[d] = ss[d + 1] * src_shape[d + 1];
    ds[d] = ds[d + 1] * dst_shape[d + 1];
  }
  Shape at(rank, 0);  // the position within extents; the last dimension is copied as one run
  const size_t run = static_cast<size_t>(extents[rank - 1]) * es;
  while (true) {
    int64_t s = -src_bias, t = 0;
    for (size_t d = 0; d < rank; ++d) {
      s += (src_at[d] + at[d]) * ss[d];
      t += (dst_at[d] + at[d]) * ds[d];
    }
    std::memcpy(dst + t * static_cast<int64_t>(es), src + s * static_cast<int64_t>(es), run);
    size_t d = rank - 1;
    while (d-- > 0) {
      if (++at[d] < extents[d]) break;
      at[d] = 0;
    }
    if (d == static_cast<size_t>(-1)) return;
  }
}

}  // namespace

std::vector<Box> range_boxes(const Shape& shape, int64_t begin, int64_t end) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  LOOM_CHECK(0 <= begin && begin <= end && end <= n);
  std::vector<Box> out;
  if (shape.empty()) {
    if (begin < end) out.push_back(Box{});
    return out;
  }
  Shape prefix;
  range_boxes_into(shape, prefix, begin, end, out);
  return out;
}

std::vector<std::pair<Box, Box>> logical_boxes(const ParamInfo& p, const Box& local) {
  if (p.split.dim < 0) return {{local, local}};
  const auto d = static_cast<size_t>(p.split.dim);
  const int64_t piece = p.shape[d] / p.split.groups;  // of each group, on this rank
  std::vector<std::pair<Box, Box>> out;
  for (int64_t g = 0; g < p.split.groups; ++g) {
    const int64_t lo = std::max(local.offsets[d], g * piece);
    const int64_t hi = std::min(local.offsets[d] + local.extents[d], (g + 1) * piece);
    if (hi <= lo) continue;
    Box l = local;
    l.offsets[d] = lo;
    l.extents[d] = hi - lo;
    Box w = l;
    w.offsets[d] = (g * p.split.parts + p.split.index) * piece + (lo - g * piece);
    out.emplace_back(std::move(w), std::move(l));
  }
  return out;
}

void copy_box(const void* src, const Shape& src_shape, const Shape& src_at, void* dst, const Shape& dst_shape,
              const Shape& dst_at, const Shape& extents, size_t elem_bytes) {
  copy_box_biased(static_cast<const char*>(src), 0, src_shape, src_at, static_cast<char*>(dst), dst_shape, dst_at,
                  extents, elem_bytes);
}

void PieceArena::reserve(size_t bytes, bool touch) {
  used_ = 0;
  reserved_ = bytes;
  if (!(storage_ && storage_.use_count() == 1 && storage_->bytes() >= bytes))
    storage_ = std::make_shared<Storage>(bytes, /*huge_pages=*/true);
  if (touch) std::memset(storage_->data(), 0, bytes);
}

Tensor PieceArena::take(const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  LOOM_CHECK(storage_ != nullptr && used_ + bytes <= reserved_);
  Tensor t(storage_, used_, shape, dtype);
  used_ += bytes;
  return t;
}

namespace {
// Calls make(piece of p's logical tensor, the run's base, its bias, the box of p it comes
// from) for each box of each parameter the runs hold, in flat order.
template <typename Make>
void for_each_box(const ParamSet& params, const std::vector<FlatRun>& runs, Make make) {
  for (const FlatRun& r : runs) {
    for (const ParamInfo& p : params.infos()) {
      const int64_t lo = std::max(r.begin, p.offset), hi = std::min(r.end, p.offset + p.numel);
      if (hi <= lo) continue;
      // The run's element p.offset + i is at data[p.offset + i - r.begin].
      const auto* base = static_cast<const char*>(r.data);
      for (const Box& local : range_boxes(p.shape, lo - p.offset, hi - p.offset))
        for (auto& [logical, from] : logical_boxes(p, local)) make(p, std::move(logical), base, r.begin - p.offset, from);
    }
  }
}
}  // namespace

std::vector<Piece> pieces(const ParamSet& params, const std::vector<FlatRun>& runs, const std::string& prefix,
                          PieceArena* arena) {
  const size_t es = dtype_size(params.dtype());
  PieceArena own;
  if (arena == nullptr) {  // one allocation for every piece, in huge pages: the copy is written whole at once
    int64_t total = 0;
    for (const FlatRun& r : runs) total += r.end - r.begin;
    own.reserve(static_cast<size_t>(total) * es);
    arena = &own;
  }
  std::vector<Piece> out;
  for_each_box(params, runs, [&](const ParamInfo& p, Box logical, const char* base, int64_t bias, const Box& from) {
    Tensor data = arena->take(logical.extents, params.dtype());
    copy_box_biased(base, bias, p.shape, from.offsets, static_cast<char*>(data.raw()), logical.extents,
                    Shape(logical.extents.size(), 0), logical.extents, es);
    out.push_back({.name = prefix + p.name, .shape = p.global_shape, .box = std::move(logical), .data = std::move(data)});
  });
  return out;
}

std::vector<Piece> pieces_in_place(const ParamSet& params, const std::vector<FlatRun>& runs, const std::string& prefix) {
  const size_t es = dtype_size(params.dtype());
  std::vector<Piece> out;
  for_each_box(params, runs, [&](const ParamInfo& p, Box logical, const char* base, int64_t bias, const Box& from) {
    Piece piece{.name = prefix + p.name, .shape = p.global_shape, .box = std::move(logical)};
    piece.fill_dtype = params.dtype();
    piece.fill = [base, bias, src_shape = p.shape, at = from.offsets, extents = piece.box.extents, es](void* dst) {
      copy_box_biased(base, bias, src_shape, at, static_cast<char*>(dst), extents, Shape(extents.size(), 0), extents, es);
    };
    out.push_back(std::move(piece));
  });
  return out;
}

}  // namespace loom::checkpoint
