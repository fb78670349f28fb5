/* libonebit_core: onebit's embedded worker and coordinator (python/embedded.h) behind a C
 * interface, which the Python package loads with ctypes (python/onebit/_native.py).
 *
 * Why C and not a CPython extension: a C library depends on no Python, NumPy or torch ABI,
 * so one wheel serves every CPython from 3.9 on, with any NumPy and any torch. Tensors
 * cross as addresses (torch's data_ptr()); nothing here holds a Python object.
 *
 * Conventions:
 * - A function that can fail returns an int: 0 for success, else an absl::StatusCode
 *   (3 INVALID_ARGUMENT, 14 UNAVAILABLE, ...); onebit_last_error() then gives the message,
 *   for the calling thread, until its next failing call.
 * - Strings returned through char** are allocated here: free them with onebit_free().
 * - Handles (onebit_worker, onebit_coordinator, onebit_state, onebit_options) are owned by
 *   the caller and released with their _free function; a null handle is INVALID_ARGUMENT.
 * - Every function may be called from any thread, and may block (the caller releases its
 *   interpreter lock: ctypes does).
 * - The ABI version changes whenever a signature does; the package checks it at load.
 */
#ifndef ONEBIT_PYTHON_C_API_H_
#define ONEBIT_PYTHON_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ONEBIT_ABI_VERSION 5

typedef struct onebit_worker onebit_worker;
typedef struct onebit_coordinator onebit_coordinator;
typedef struct onebit_state onebit_state;
typedef struct onebit_options onebit_options;

int onebit_abi_version(void);
const char* onebit_last_error(void);
void onebit_free(void* p);

/* ---- Job configs ---- */
/* A config's text (comments and trailing commas allowed) as strict JSON. */
int onebit_strict_json(const char* text, char** json);
/* Loads a config file: its notices (keys accepted without effect) as a JSON list. */
int onebit_check_config(const char* path, char** notices_json);
/* What the package decides its defaults by, as a JSON object: warmup_between_workers,
 * scales_loss, micro_batches, cycles_betas. */
int onebit_config_facts(const char* text, char** facts_json);
int onebit_default_max_restarts(void);
int onebit_max_mask_ranges(void);

/* ---- Optimizer states: sections 0 tensors, 1 errors (float arrays), 2 scalars,
 * 3 trainer (doubles) ---- */
onebit_state* onebit_state_new(int64_t step, int64_t freeze_step, int rank, int world_size);
void onebit_state_free(onebit_state* s);
int64_t onebit_state_step(const onebit_state* s);
int64_t onebit_state_freeze_step(const onebit_state* s);
/* Copies n floats from `data`. A name given twice: INVALID_ARGUMENT. */
int onebit_state_put_tensor(onebit_state* s, int section, const char* name, const float* data,
                            size_t n);
int onebit_state_put_scalar(onebit_state* s, int section, const char* name, double value);
/* Entries of a section, in order; the name stays valid while the state lives. */
size_t onebit_state_count(const onebit_state* s, int section);
const char* onebit_state_name(const onebit_state* s, int section, size_t i);
size_t onebit_state_tensor_size(const onebit_state* s, int section, size_t i);
/* Copies tensor i of a tensor section into out (onebit_state_tensor_size floats). */
int onebit_state_tensor_copy(const onebit_state* s, int section, size_t i, float* out);
double onebit_state_scalar(const onebit_state* s, int section, size_t i);

/* ---- A worker's options: keys of WorkerProcessOptions by name ---- */
onebit_options* onebit_options_new(void);
void onebit_options_free(onebit_options* o);
/* Strings: config, coordinator, host, summary_file, history_csv, member_token_file, fault,
 * job_key. Integers: metrics_port, rank, cuda_device, quiet (0 or 1). Another key:
 * INVALID_ARGUMENT. */
int onebit_options_set_string(onebit_options* o, const char* key, const char* value);
int onebit_options_set_int(onebit_options* o, const char* key, int64_t value);
/* A parameter group with its own lr (a multiple of the job's) and weight decay. */
int onebit_options_add_hyper_group(onebit_options* o, uint64_t begin, uint64_t end,
                                   float lr_scale, float weight_decay);
/* An overlap bucket, in announcement order. */
int onebit_options_add_bucket(onebit_options* o, uint64_t begin, uint64_t end);
/* A boundary of the model's tensors (all of them in order: {0, e_1, ..., n}). */
int onebit_options_add_group_boundary(onebit_options* o, uint64_t boundary);

/* ---- The worker ---- */
/* `initial`: the model's n parameters (copied); `loaded`: a state loaded before the first
 * step, or null (copied). Does not start it. */
int onebit_worker_new(const onebit_options* o, const float* initial, size_t n,
                      const onebit_state* loaded, onebit_worker** out);
/* Closes the worker, waits for its thread and frees it. */
void onebit_worker_free(onebit_worker* w);
int onebit_worker_start(onebit_worker* w);
/* The next step (-1: the job is over for this worker). */
int onebit_worker_wait_for_step(onebit_worker* w, double timeout_s, int64_t* step);
/* What the script set for one step: the fields whose bit is in `set`; the others are
 * ignored (the job's schedule or fixed value applies). Ranges: lr and max_grad_norm >= 0;
 * beta1 and beta2 in [0, 1); grad_scale (the factor the script's GradScaler multiplied the
 * gradient by) finite and > 0; weight_decays one per hyper group, each >= 0 and finite. */
enum {
  ONEBIT_STEP_LOSS = 1u << 0,
  ONEBIT_STEP_LR = 1u << 1,
  ONEBIT_STEP_MAX_GRAD_NORM = 1u << 2,
  ONEBIT_STEP_BETAS = 1u << 3, /* beta1 and beta2 */
  ONEBIT_STEP_WEIGHT_DECAYS = 1u << 4,
  ONEBIT_STEP_GRAD_SCALE = 1u << 5,
};
typedef struct onebit_step_inputs {
  uint32_t set;
  double loss;
  double lr;
  double max_grad_norm;
  double beta1;
  double beta2;
  double grad_scale;
  const double* weight_decays; /* n_weight_decays of them, read during the call */
  size_t n_weight_decays;
} onebit_step_inputs;
/* Step `step`'s gradient is in place; `inputs` (read during the call) what the script set
 * for it. INVALID_ARGUMENT for a bit `set` does not know or a value out of range. */
int onebit_worker_supply_step(onebit_worker* w, int64_t step, const onebit_step_inputs* inputs);
/* *skipped 1 when step `step` was skipped (an overflow on some worker). */
int onebit_worker_skipped(onebit_worker* w, int64_t step, int* skipped);
int onebit_worker_announce(onebit_worker* w, int64_t step, uint64_t bucket);
int onebit_worker_loss_scale(onebit_worker* w, float* scale);
int onebit_worker_changed_since_announced(onebit_worker* w, int64_t* first);
int onebit_worker_end_after(onebit_worker* w, int64_t step);
int onebit_worker_close(onebit_worker* w, const char* why);
/* *done 0 while the worker runs; else its exit code (0, 1; 2 bad input) and status text. */
int onebit_worker_join(onebit_worker* w, double timeout_s, int* done, int* code,
                       char** message);
int onebit_worker_fail_job(onebit_worker* w, const char* why, int64_t step, int* exit_code);
int onebit_worker_verdict_after_failure(onebit_worker* w, int* exit_code, char** reason);
int onebit_worker_report_restartable_exit(onebit_worker* w, const char* why, int64_t step);
/* The parameters' and the gradient's buffers: host memory, or device memory when *cuda. */
int onebit_worker_buffers(onebit_worker* w, uintptr_t* params, uintptr_t* gradient, int* cuda);
/* Copies the final parameters (n floats) once the job ended. */
int onebit_worker_final_params(onebit_worker* w, float* out, size_t n);
/* The state between two steps. A sharded worker's (onebit.exchange.shard_state) holds every
 * tensor over its state range only, which the scalars "state_begin" and "state_end" name
 * (python/optimizer_state.h). */
int onebit_worker_state_dict(onebit_worker* w, onebit_state** out);
/* Elements [begin, end) of each tensor but the parameters. A sharded worker holds them
 * within its state range: INVALID_ARGUMENT naming that range for a non-empty other; its
 * slices' scalars "state_begin" and "state_end" name that range. */
int onebit_worker_state_slice(onebit_worker* w, int64_t begin, int64_t end, onebit_state** out);
/* A whole state, or exactly a sharded worker's own range (anything else: INVALID_ARGUMENT
 * naming both). A sharded worker's load all-gathers the parameters inside its node: every
 * local rank loads at the same step. */
int onebit_worker_load_state_dict(onebit_worker* w, const onebit_state* s);
/* The whole state between two steps. A sharded worker all-gathers each tensor inside its
 * node: a collective, every local rank calls it at the same step (FAILED_PRECONDITION once
 * the job is over). An unsharded worker's is onebit_worker_state_dict's. */
int onebit_worker_gathered_state_dict(onebit_worker* w, onebit_state** out);
int onebit_worker_rank(onebit_worker* w);
int onebit_worker_world_size(onebit_worker* w);
size_t onebit_worker_size(onebit_worker* w);
/* The model's parameters as the worker keeps them (like onebit_worker_buffers: host memory,
 * or device memory when cuda). *dtype 1 bf16 or 2 fp16: a sharded worker's low-precision
 * parameters (the option param_dtype with onebit.exchange.shard_state), 2 bytes each, in
 * the model's order and padded past its n; onebit_worker_buffers' parameters are then
 * null. *dtype 0: float32, the parameters of onebit_worker_buffers. */
int onebit_worker_param_buffer(onebit_worker* w, uintptr_t* address, int* dtype);
/* The gradient buffer the model's .grad tensors view (like onebit_worker_buffers: host
 * memory, or device memory when cuda), n elements. *dtype 1 bf16: a bf16 model's in a
 * sharded job (2 bytes each; onebit_worker_buffers' gradient is then null). *dtype 0:
 * float32, onebit_worker_buffers' gradient. */
int onebit_worker_gradient_buffer(onebit_worker* w, uintptr_t* address, int* dtype);

/* ---- The coordinator rank 0 embeds ---- */
int onebit_coordinator_start(const char* config, const char* host, int port, int rest_port,
                             int metrics_port, const char* code_digest, const char* job_key,
                             onebit_coordinator** out);
void onebit_coordinator_free(onebit_coordinator* c);
/* which: 0 gRPC, 1 REST, 2 metrics ("host:port"). */
int onebit_coordinator_address(onebit_coordinator* c, int which, char** address);
/* "running", "succeeded", "failed" or "closed". */
int onebit_coordinator_poll(onebit_coordinator* c, char** state);
int onebit_coordinator_failure_reason(onebit_coordinator* c, char** reason);
int onebit_coordinator_abandon(onebit_coordinator* c, const char* reason);
int onebit_coordinator_recover(onebit_coordinator* c, const char* reason);
int onebit_coordinator_close(onebit_coordinator* c);

#ifdef __cplusplus
}
#endif

#endif /* ONEBIT_PYTHON_C_API_H_ */
