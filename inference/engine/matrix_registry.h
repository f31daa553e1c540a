// handle -> a weight kernel's packed matrix: what the compiled step names by number
// (weights/handles.py), so a graph's call reaches its kernel without Python or the GIL.

#pragma once

#include <torch/extension.h>

#include <mutex>
#include <unordered_map>
#include <utility>

namespace tandem {

template <typename Matrix>
class MatrixRegistry {
 public:
  explicit MatrixRegistry(const char* kernel) : kernel_(kernel) {}

  void put(int64_t handle, Matrix matrix) {
    std::lock_guard<std::mutex> guard(lock_);
    held_[handle] = std::move(matrix);
  }

  void erase(int64_t handle) {
    std::lock_guard<std::mutex> guard(lock_);
    held_.erase(handle);
  }

  // A copy (tensors are shared, not copied), so a release meanwhile leaves the call its data.
  Matrix get(int64_t handle) {
    std::lock_guard<std::mutex> guard(lock_);
    auto found = held_.find(handle);
    TORCH_CHECK(found != held_.end(), kernel_, ": no matrix is registered as ", handle);
    return found->second;
  }

 private:
  const char* kernel_;
  std::mutex lock_;
  std::unordered_map<int64_t, Matrix> held_;
};

}  // namespace tandem
