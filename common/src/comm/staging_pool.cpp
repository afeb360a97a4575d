// staging_pool.cpp — the mpi backend's pool of pinned staging buffers (staging_pool.h).
#include "scalelab/comm/staging_pool.h"

#include "scalelab/core/error.h"  // defines: SL_CHECK, SL_CHECK_HINT

namespace scalelab {

std::shared_ptr<StagingPool> StagingPool::make(AllocFn alloc, FreeFn free) {
  return std::shared_ptr<StagingPool>(new StagingPool(std::move(alloc), std::move(free)));
}

StagingPool::~StagingPool() {
  for (void* p : all_) free_(p);
}

size_t StagingPool::size_class(size_t nbytes) {
  size_t c = kMinClassBytes;
  while (c < nbytes) c *= 2;
  return c;
}

StagingPool::Lease StagingPool::acquire(size_t nbytes) {
  SL_CHECK(nbytes > 0, "StagingPool::acquire of 0 bytes: stage only non-empty tensors");
  const size_t bytes = size_class(nbytes);
  Lease lease;
  lease.pool_ = shared_from_this();
  lease.bytes_ = bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<void*>& idle = idle_[bytes];
    if (!idle.empty()) {
      lease.ptr_ = idle.back();
      idle.pop_back();
      ++stats_.leased;
      return lease;
    }
  }
  void* p = alloc_(bytes);  // outside the lock: cudaMallocHost takes milliseconds
  SL_CHECK_HINT(p != nullptr, "pinned host memory is limited (ulimit -l, the machine's RAM): fewer ranks per node",
                "the staging pool could not allocate %zu bytes (a request of %zu)", bytes, nbytes);
  std::lock_guard<std::mutex> lock(mu_);
  all_.push_back(p);
  ++stats_.system_allocations;
  ++stats_.buffers;
  ++stats_.leased;
  stats_.bytes += static_cast<int64_t>(bytes);
  lease.ptr_ = p;
  return lease;
}

void StagingPool::give_back(void* ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_[bytes].push_back(ptr);
  --stats_.leased;
}

StagingPool::Stats StagingPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

StagingPool::Lease& StagingPool::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    reset();
    pool_ = std::move(o.pool_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void StagingPool::Lease::reset() {
  if (ptr_) pool_->give_back(ptr_, bytes_);
  ptr_ = nullptr;
  bytes_ = 0;
  pool_.reset();
}

}  // namespace scalelab
