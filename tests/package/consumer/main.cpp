// A project outside the tree, built against the installed package.
#include <asyncinfer/asyncinfer.hpp>

#include <cstdio>

int main() {
  auto engine = asyncinfer::Engine::create(*asyncinfer::load_model("builtin:identity"),
                                           *asyncinfer::open_device("cpu"));
  if (!engine.ok()) return 1;
  auto out = (*engine)->infer({*asyncinfer::Tensor::zeros(asyncinfer::DType::f32, {2, 3})});
  if (!out.ok() || (*out)[0].shape() != asyncinfer::Shape{2, 3}) return 1;
  std::printf("consumer ok\n");
  return 0;
}
