// NCCL's functions that nccl_transport.cc calls, resolved from libnccl.so.2 at their first
// call (dlopen) instead of at load time. A binary or library with NCCL's transport then
// starts on any machine, a CPU-only one or one whose NCCL lives elsewhere (pip's
// nvidia-nccl package): only a job that uses NCCL needs it. Where it cannot load, every
// call answers ncclSystemError and ncclGetLastError says why.
//
// Where NCCL is looked for: $ONEBIT_NCCL_LIBRARY (a path), else the dynamic loader's search
// for libnccl.so.2 (LD_LIBRARY_PATH, ld.so.conf: CUDA's /usr/local/cuda/lib).
#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <mutex>
#include <string>

namespace {

struct NcclApi {
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommFinalize) comm_finalize = nullptr;
  decltype(&ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&ncclCommInitRankConfig) comm_init_rank_config = nullptr;
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclGetLastError) get_last_error = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclSend) send = nullptr;
  std::string error;  // why NCCL could not be loaded ("" once it is)
};

const NcclApi& Api() {
  static const NcclApi* api = [] {
    auto* a = new NcclApi;
    const char* given = std::getenv("ONEBIT_NCCL_LIBRARY");
    const std::string name = given != nullptr && *given != '\0' ? given : "libnccl.so.2";
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      a->error = "cannot load NCCL (" + name + "): " + (why ? why : "unknown error") +
                 "; install NCCL 2 (CUDA's, or pip's nvidia-nccl) or set ONEBIT_NCCL_LIBRARY";
      return a;
    }
    bool ok = true;
    auto get = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
      if (fn == nullptr && ok) {
        ok = false;
        a->error = name + " lacks " + symbol + ", which onebit needs (NCCL >= 2.18)";
      }
    };
    get(a->all_gather, "ncclAllGather");
    get(a->all_reduce, "ncclAllReduce");
    get(a->comm_abort, "ncclCommAbort");
    get(a->comm_destroy, "ncclCommDestroy");
    get(a->comm_finalize, "ncclCommFinalize");
    get(a->comm_get_async_error, "ncclCommGetAsyncError");
    get(a->comm_init_rank_config, "ncclCommInitRankConfig");
    get(a->get_error_string, "ncclGetErrorString");
    get(a->get_last_error, "ncclGetLastError");
    get(a->get_unique_id, "ncclGetUniqueId");
    get(a->group_end, "ncclGroupEnd");
    get(a->group_start, "ncclGroupStart");
    get(a->recv, "ncclRecv");
    get(a->send, "ncclSend");
    if (!ok) {
      NcclApi failed;  // none of it: a partial table would fail later, and less clearly
      failed.error = a->error;
      *a = failed;
    }
    return a;
  }();
  return *api;
}

}  // namespace

// Each forwards to NCCL's own, or fails as NCCL does for a system error.
#define ONEBIT_NCCL_FORWARD(member, ...)                    \
  const NcclApi& api = Api();                               \
  if (api.member == nullptr) return ncclSystemError;        \
  return api.member(__VA_ARGS__)

extern "C" {

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  ONEBIT_NCCL_FORWARD(all_gather, sendbuff, recvbuff, sendcount, datatype, comm, stream);
}
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  ONEBIT_NCCL_FORWARD(all_reduce, sendbuff, recvbuff, count, datatype, op, comm, stream);
}
ncclResult_t ncclCommAbort(ncclComm_t comm) { ONEBIT_NCCL_FORWARD(comm_abort, comm); }
ncclResult_t ncclCommDestroy(ncclComm_t comm) { ONEBIT_NCCL_FORWARD(comm_destroy, comm); }
ncclResult_t ncclCommFinalize(ncclComm_t comm) { ONEBIT_NCCL_FORWARD(comm_finalize, comm); }
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  ONEBIT_NCCL_FORWARD(comm_get_async_error, comm, asyncError);
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  ONEBIT_NCCL_FORWARD(comm_init_rank_config, comm, nranks, commId, rank, config);
}
const char* ncclGetErrorString(ncclResult_t result) {
  const NcclApi& api = Api();
  if (api.get_error_string == nullptr) return api.error.c_str();
  return api.get_error_string(result);
}
const char* ncclGetLastError(ncclComm_t comm) {
  const NcclApi& api = Api();
  if (api.get_last_error == nullptr) return api.error.c_str();
  return api.get_last_error(comm);
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  ONEBIT_NCCL_FORWARD(get_unique_id, uniqueId);
}
ncclResult_t ncclGroupEnd() { ONEBIT_NCCL_FORWARD(group_end); }
ncclResult_t ncclGroupStart() { ONEBIT_NCCL_FORWARD(group_start); }
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  ONEBIT_NCCL_FORWARD(recv, recvbuff, count, datatype, peer, comm, stream);
}
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  ONEBIT_NCCL_FORWARD(send, sendbuff, count, datatype, peer, comm, stream);
}

}  // extern "C"
