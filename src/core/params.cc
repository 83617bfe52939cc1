#include "loom/core/params.h"

#include <algorithm>

#include "loom/core/error.h"

namespace loom {

Tensor ParamRef::value() const { return set_->value(index_); }
Tensor ParamRef::grad() const { return set_->grad(index_); }
const ParamInfo& ParamRef::info() const { return set_->infos()[index_]; }

namespace {
// The piece's layout: outer x (groups x piece) x inner, of a logical outer x (groups x
// parts x piece) x inner.
struct PieceLayout {
  int64_t outer = 1, inner = 1, piece = 0, groups = 1, parts = 1, index = 0;
};
PieceLayout piece_layout(const ParamInfo& p) {
  PieceLayout l;
  const int d = p.split.dim;
  for (int i = 0; i < d; ++i) l.outer *= p.shape[i];
  for (size_t i = static_cast<size_t>(d) + 1; i < p.shape.size(); ++i) l.inner *= p.shape[i];
  l.groups = p.split.groups;
  l.parts = p.split.parts;
  l.index = p.split.index;
  l.piece = p.shape[d] / l.groups;
  return l;
}

// Calls run(offset in the logical tensor, offset in the piece, count) for each contiguous
// run of the piece.
template <typename Run>
void for_each_run(const ParamInfo& p, Run run) {
  if (p.split.dim < 0) return run(0, 0, p.numel);
  const PieceLayout l = piece_layout(p);
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t g = 0; g < l.groups; ++g)
      run(((o * l.groups + g) * l.parts + l.index) * l.piece * l.inner, (o * l.groups + g) * l.piece * l.inner,
          l.piece * l.inner);
}
}  // namespace

template <typename T>
void take_piece(const ParamInfo& p, const T* whole, T* mine) {
  for_each_run(p, [&](int64_t w, int64_t m, int64_t n) { std::copy_n(whole + w, n, mine + m); });
}

template <typename T>
void put_piece(const ParamInfo& p, const T* mine, T* whole) {
  for_each_run(p, [&](int64_t w, int64_t m, int64_t n) { std::copy_n(mine + m, n, whole + w); });
}

template void take_piece<float>(const ParamInfo&, const float*, float*);
template void take_piece<double>(const ParamInfo&, const double*, double*);
template void put_piece<float>(const ParamInfo&, const float*, float*);
template void put_piece<double>(const ParamInfo&, const double*, double*);

ParamRef ParamSet::add(const std::string& name, const Shape& shape, ParamKind kind, ParamSplit split) {
  LOOM_CHECK(!values_.defined());
  LOOM_CHECK_EQ(find(name), -1);
  int64_t n = shape_numel(shape);
  Shape global = shape;
  if (split.dim >= 0) {
    LOOM_CHECK(split.dim < static_cast<int>(shape.size()) && split.parts >= 1 && split.index >= 0 && split.index < split.parts);
    LOOM_CHECK_EQ(shape[split.dim] % split.groups, 0);
    global[split.dim] *= split.parts;
  }
  infos_.push_back({name, shape, kind, numel_, n, split, global});
  numel_ += n;
  return ParamRef(this, static_cast<int>(infos_.size()) - 1);
}

void ParamSet::allocate() {
  LOOM_CHECK(!values_.defined());
  values_ = Tensor::zeros({numel_}, dtype_);
  grads_ = Tensor::zeros({numel_}, dtype_);
}

void ParamSet::adopt_grads(Tensor g) {
  LOOM_CHECK(grads_.defined() && g.dtype() == dtype_ && g.numel() == numel_ && g.is_contiguous());
  g.copy_from(grads_);
  grads_ = std::move(g);
}

int ParamSet::find(const std::string& name) const {
  for (size_t i = 0; i < infos_.size(); ++i)
    if (infos_[i].name == name) return static_cast<int>(i);
  return -1;
}

namespace {
Tensor view_of(const Tensor& flat, const ParamInfo& p) {
  LOOM_CHECK(flat.defined());
  return Tensor(flat.storage(), flat.offset_bytes() + p.offset * dtype_size(flat.dtype()),
                p.shape, flat.dtype());
}
}  // namespace

Tensor ParamSet::value(int index) const { return view_of(values_, infos_.at(index)); }
Tensor ParamSet::grad(int index) const { return view_of(grads_, infos_.at(index)); }

}  // namespace loom
