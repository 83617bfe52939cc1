#include "loom/params.h"

namespace loom {

Tensor ParamRef::value() const { return set_->value(index_); }
Tensor ParamRef::grad() const { return set_->grad(index_); }
const ParamInfo& ParamRef::info() const { return set_->infos()[index_]; }

ParamRef ParamSet::add(const std::string& name, const Shape& shape, ParamKind kind) {
  LOOM_CHECK(!values_.defined());
  LOOM_CHECK_EQ(find(name), -1);
  int64_t n = shape_numel(shape);
  infos_.push_back({name, shape, kind, numel_, n});
  numel_ += n;
  return ParamRef(this, static_cast<int>(infos_.size()) - 1);
}

void ParamSet::allocate() {
  LOOM_CHECK(!values_.defined());
  values_ = Tensor::zeros({numel_}, dtype_);
  grads_ = Tensor::zeros({numel_}, dtype_);
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
