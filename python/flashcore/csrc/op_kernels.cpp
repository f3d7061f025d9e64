// The CPU and CUDA kernels of the torch ops flashcore::attention_fwd and
// flashcore::attention_bwd in C++: they fill the C API's args straight from
// the tensors and call the library. Everything else about the ops (schemas,
// fake kernels, autograd) stays in _torch_ops.py; _torch_ext.py builds this
// file with the system compiler and loads it.
//
// Why: a compiled graph without CUDA graphs calls the op's kernel on every
// step, and the Python kernel (dispatcher to Python, then the ctypes
// binding) cost ~60 us of host time per op on an H100 host (docs/PERF.md).
//
// A call this file does not take as it is (varlen offsets, an empty tensor,
// an FP8 or other dtype, a layout or option the binding's checks refuse) or
// that the library answers with an error runs the Python kernel instead
// (flashcore::_attention_fwd_py / _attention_bwd_py: the same schema), so
// every result and every error (class and message) is the Python path's.
//
// Built with FLASHCORE_EAGER (where Python's headers are there), the file
// also holds flashcore.attention's eager call (the section at its end): a
// Python function that runs a plain call on torch tensors without the
// binding's Python, and answers None for every call it does not take.
//
// No CUDA header: the stream comes from c10's device-generic interface.

#ifdef FLASHCORE_EAGER
#include <torch/csrc/autograd/python_variable.h>  // Python.h first, as Python wants it
#endif

#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/custom_function.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/library.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>

#include "flashcore.h"

// One per OS thread, shared with the Python binding's context of that thread
// (_context._Context adopts it), so both paths use one fc_context: its
// settings (threads, tuning), host profile and kernel info.
extern "C" struct fc_ext_thread {
    fc_context *ctx;
    int32_t device;     // the context's device and CUDA path between calls, as the
    int32_t cuda_path;  // binding caches them: a call here sets its own, then these back
    int32_t ran;        // a call here succeeded: info holds its kernel
    fc_kernel_info info[2];  // the binding's double-buffered kernel info; a call here writes both
};

namespace {

using torch::jit::Stack;
using Args = c10::ArrayRef<c10::IValue>;

// The library's entry points, from the copy the binding loaded (one library,
// one fc_context type), in fc_ext_init's order.
struct Api {
    void (*args_init)(fc_attention_args *);
    void (*bwd_args_init)(fc_attention_backward_args *);
    fc_status (*context_create)(fc_context **);
    void (*context_free)(fc_context *);
    fc_status (*set_device)(fc_context *, int);
    fc_status (*set_cuda_path)(fc_context *, int);
    fc_status (*set_tuning)(fc_context *, const fc_tuning *);
    fc_status (*forward)(fc_context *, const fc_attention_args *, void *, fc_kernel_info *);
    fc_status (*backward)(fc_context *, const fc_attention_backward_args *, void *, fc_kernel_info *);
};

Api api;
fc_attention_args fwd_init;  // fc_attention_args_init's values, copied per call
fc_attention_backward_args bwd_init;
fc_tuning env_tuning;        // the FLASHCORE_* tuning a new thread context starts from
bool has_env_tuning = false;
// CPU, CUDA, AutogradCPU, AutogradCUDA: the kernels while switched in
const c10::DispatchKey kKeys[4] = {c10::DispatchKey::CPU, c10::DispatchKey::CUDA, c10::DispatchKey::AutogradCPU,
                                   c10::DispatchKey::AutogradCUDA};
std::unique_ptr<torch::Library> registered[4];

constexpr size_t kOptions = 13;  // _torch_ops._OPTIONS
constexpr size_t kFwdArgs = 3 + kOptions + 2;  // _torch_ops: q, k, v, the options, block_table, seqused_k
constexpr size_t kBwdArgs = 6 + kOptions;      // dout, q, k, v, out, lse, the options

struct Owner {
    fc_ext_thread s{};
    bool bound = false;  // the binding's _Context of this thread uses s.ctx
    int64_t eager_calls = 0;  // calls the eager call ran on this thread
    ~Owner() {
        if (s.ctx) api.context_free(s.ctx);
    }
};

bool new_context(fc_ext_thread &s) {
    if (api.context_create(&s.ctx) != FC_OK) {
        s.ctx = nullptr;
        return false;
    }
    s.device = -1;  // fc_context_create's defaults
    s.cuda_path = 0;
    if (has_env_tuning && api.set_tuning(s.ctx, &env_tuning) != FC_OK) {
        api.context_free(s.ctx);  // the Python path raises the library's reason
        s.ctx = nullptr;
        return false;
    }
    return true;
}

Owner &owner() {
    thread_local Owner t;
    return t;
}

// This thread's state, its context made on first use (nullptr if that fails).
fc_ext_thread *thread_state() {
    Owner &t = owner();
    if (!t.s.ctx && !new_context(t.s)) return nullptr;
    return &t.s;
}

// ---- the Python checks this file repeats: a call that fails one is not taken

bool dtype_code(const at::Tensor &t, fc_dtype &d) {
    switch (t.scalar_type()) {
    case at::kFloat: d = FC_DTYPE_F32; return true;
    case at::kHalf: d = FC_DTYPE_F16; return true;
    case at::kBFloat16: d = FC_DTYPE_BF16; return true;
    case at::kDouble: d = FC_DTYPE_F64; return true;
    default: return false;  // FP8 and the rest: the Python kernel names them
    }
}

// A strided tensor on q's device without an empty dimension (_arrays.view
// pads those, _request.finish turns a dense call without rows into varlen).
bool plain(const at::Tensor &t, const at::Device &dev) {
    if (!t.defined() || t.layout() != at::kStrided || t.device() != dev || t.is_neg()) return false;
    for (int64_t n : t.sizes())
        if (n == 0) return false;
    return true;
}

// t as an fc_tensor in the library's [B,S,H,D] order (bhsd: dims 1 and 2
// swapped, no copy); false unless the last dimension is contiguous.
bool view(const at::Tensor &t, bool bhsd, fc_dtype dtype, fc_tensor &v) {
    int n = static_cast<int>(t.dim());
    if (n < 1 || n > 4) return false;
    v.data = t.data_ptr();
    v.dtype = dtype;
    v.ndim = n;
    for (int i = 0; i < n; i++) {
        v.shape[i] = t.size(i);
        v.stride[i] = t.stride(i);
    }
    if (bhsd && n == 4) {
        std::swap(v.shape[1], v.shape[2]);
        std::swap(v.stride[1], v.stride[2]);
    }
    if (v.shape[n - 1] == 1) v.stride[n - 1] = 1;  // any stride is fine over one element
    return v.stride[n - 1] == 1;
}

// _limits.float32: 0, or a value float32 holds finite and nonzero.
bool float32_ok(double x, float &f) {
    if (x == 0.0) {
        f = 0.0f;
        return true;
    }
    if (!(std::fabs(x) <= FLT_MAX)) return false;  // NaN too
    f = static_cast<float>(x);
    return f != 0.0f;
}

bool int32_ok(int64_t x) { return x >= INT32_MIN && x <= INT32_MAX; }

// s lower-cased (ASCII) is name.
bool same_lower(std::string_view s, const char *name) {
    if (s.size() != std::strlen(name)) return false;
    for (size_t j = 0; j < s.size(); j++)
        if ((s[j] >= 'A' && s[j] <= 'Z' ? s[j] + 32 : s[j]) != name[j]) return false;
    return true;
}

// _lib.BACKENDS, as _request.check_names reads them (any case).
int backend_code(std::string_view s) {
    static const char *names[] = {"auto", "cpu", "cuda", "cpu_reference"};
    for (int i = 0; i < 4; i++)
        if (same_lower(s, names[i])) return i;
    return -1;
}

struct Options {
    float scale, softcap;
    bool causal, bhsd, deterministic;
    int32_t window_left, window_right;
    int backend, cuda_path;
};

// The options (_torch_ops._OPTIONS), a from cu_seqlens_q on. Variable
// length calls are the Python kernel's: their offsets are data it checks.
bool options(Args a, Options &o) {
    if (!a[0].isNone() || !a[1].isNone()) return false;
    if (!float32_ok(a[4].toDouble(), o.scale) || !float32_ok(a[5].toDouble(), o.softcap)) return false;
    int64_t wl = a[7].toInt(), wr = a[8].toInt(), path = a[11].toInt();
    if (!int32_ok(wl) || !int32_ok(wr)) return false;
    o.causal = a[6].toBool();
    o.window_left = static_cast<int32_t>(wl);
    o.window_right = static_cast<int32_t>(wr);
    o.bhsd = a[9].toBool();
    o.backend = backend_code(a[10].toStringRef());
    o.cuda_path = static_cast<int>(path);
    o.deterministic = a[12].toBool();
    return o.backend >= 0 && (path == 0 || path == 80 || path == 90);
}

void put_options(const Options &o, fc_attention_args &a) {
    a.scale = o.scale;
    a.softcap = o.softcap;
    a.causal = o.causal ? 1 : 0;
    a.window_left = o.window_left;
    a.window_right = o.window_right;
    a.backend = static_cast<fc_backend>(o.backend);
}

// q, k, v: dense 4-D tensors of one supported dtype on one device, which
// the backend can read (_request._check_operands).
bool operands(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const Options &o,
              fc_attention_args &a) {
    fc_dtype d;
    const at::Device dev = q.device();
    if (!dtype_code(q, d) || !(dev.is_cpu() || dev.is_cuda())) return false;
    for (const at::Tensor *t : {&q, &k, &v})
        if (!plain(*t, dev) || t->dim() != 4 || t->scalar_type() != q.scalar_type()) return false;
    bool cpu_backend = o.backend == FC_BACKEND_CPU || o.backend == FC_BACKEND_CPU_REFERENCE;
    if (dev.is_cuda() ? cpu_backend : o.backend == FC_BACKEND_CUDA) return false;
    put_options(o, a);
    return view(q, o.bhsd, d, a.q) && view(k, o.bhsd, d, a.k) && view(v, o.bhsd, d, a.v);
}

// An int32 array the library reads in place (_arrays.int32_in_place): rows
// with a contiguous last dimension that do not overlap.
bool int32_rows(const at::Tensor &t, const at::Device &dev, int64_t dim, int64_t batch) {
    if (!plain(t, dev) || t.scalar_type() != at::kInt || t.dim() != dim || t.size(0) != batch) return false;
    if (t.size(-1) > 1 && t.stride(-1) != 1) return false;
    return dim < 2 || batch <= 1 || t.stride(0) >= t.size(1);
}

// The paged cache and the key counts (_request._fill_paged): block_table,
// seqused_k (nullptr: not given).
bool paged(const at::Tensor *table, const at::Tensor *used, const at::Device &dev, fc_attention_args &args) {
    const int64_t batch = args.q.shape[0];
    if (table) {
        if (!int32_rows(*table, dev, 2, batch) || !int32_ok(table->size(1))) return false;
        args.block_table = table->data_ptr<int32_t>();
        args.max_pages_per_seq = static_cast<int32_t>(table->size(1));
        args.block_table_stride = batch > 1 ? table->stride(0) : 0;
    }
    if (used) {
        if (!int32_rows(*used, dev, 1, batch)) return false;
        args.seqused_k = used->data_ptr<int32_t>();
    }
    return true;
}

// The ops' block_table and seqused_k arguments (None: not given).
bool paged(Args a, const at::Device &dev, fc_attention_args &args) {
    return paged(a[0].isNone() ? nullptr : &a[0].toTensor(), a[1].isNone() ? nullptr : &a[1].toTensor(), dev,
                 args);
}

// A new output of t's shape, dtype and device: a 4-D bhsd one is a
// [B,H,S,D] view of [B,S,H,D] memory (_arrays.new_output: torch's SDPA
// makes its out so, and the usual transpose(1, 2).reshape then copies nothing).
at::Tensor new_output(const at::Tensor &t, bool bhsd) {
    if (!bhsd || t.dim() != 4) return at::empty(t.sizes(), t.options());
    return at::empty({t.size(0), t.size(2), t.size(1), t.size(3)}, t.options()).transpose(1, 2);
}

// ---- running a call

void *stream_of(const at::Device &dev) {
    if (!dev.is_cuda()) return nullptr;
    c10::impl::VirtualGuardImpl impl(dev.type());
    return impl.getStream(dev).native_handle();  // torch's current stream, as the binding's
}

// entry on t's context with the call's device and CUDA path, on stream,
// then the context's own back; on success its kernel is the binding's last
// one. Throws nothing (the eager call runs it without the GIL).
template <class A, class Entry>
bool run_on(fc_ext_thread *t, Entry entry, const A &args, const at::Device &dev, int cuda_path, void *stream) {
    int device = dev.is_cuda() ? dev.index() : -1;
    if (device != t->device) api.set_device(t->ctx, device);
    if (cuda_path != t->cuda_path) api.set_cuda_path(t->ctx, cuda_path);
    fc_kernel_info info;
    fc_status st = entry(t->ctx, &args, stream, &info);
    if (device != t->device) api.set_device(t->ctx, t->device);
    if (cuda_path != t->cuda_path) api.set_cuda_path(t->ctx, t->cuda_path);
    if (st != FC_OK) return false;  // the Python kernel runs it again and raises
    t->info[0] = t->info[1] = info;
    t->ran = 1;
    return true;
}

// run_on this thread's context (made if need be).
template <class A, class Entry>
bool run(Entry entry, const A &args, const at::Device &dev, int cuda_path) {
    fc_ext_thread *t = thread_state();
    return t && run_on(t, entry, args, dev, cuda_path, stream_of(dev));
}

// The Python kernel (an op of the same schema) on the arguments still on
// the stack: what this file does not take, and every error.
void python_kernel(const c10::OperatorHandle &op, Stack *stack) {
    at::AutoDispatchBelowADInplaceOrView below;  // already past autograd
    op.callBoxed(stack);
}

// ---- the kernels

using Pair = std::optional<std::tuple<at::Tensor, at::Tensor>>;
using Triple = std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor>>;

// attention_fwd: (out, lse) as the Python kernel makes them (new, in q's
// layout; lse float32 [batch, heads_q, seqlen_q]), or nothing if not taken.
Pair forward(Args a) {
    Options o;
    fc_attention_args args = fwd_init;
    const at::Tensor &q = a[0].toTensor();
    if (!options(a.slice(3, kOptions), o) || !operands(q, a[1].toTensor(), a[2].toTensor(), o, args) ||
        !paged(a.slice(3 + kOptions, 2), q.device(), args))
        return std::nullopt;
    at::Tensor out = new_output(q, o.bhsd);
    at::Tensor lse = at::empty({args.q.shape[0], args.q.shape[2], args.q.shape[1]}, q.options().dtype(at::kFloat));
    view(out, o.bhsd, args.q.dtype, args.out);
    view(lse, false, FC_DTYPE_F32, args.lse);
    if (!run(api.forward, args, q.device(), o.cuda_path)) return std::nullopt;
    return std::make_tuple(std::move(out), std::move(lse));
}

// x (out or dout) as the backward reads it: q's device, dtype and shape.
bool like_q(const at::Tensor &x, const at::Tensor &q, const fc_attention_args &f, bool bhsd, fc_tensor &v) {
    return plain(x, q.device()) && x.scalar_type() == q.scalar_type() && x.sizes() == q.sizes() &&
           view(x, bhsd, f.q.dtype, v);
}

// The forward's lse (_request.lse_input): float32 [batch, heads_q, seqlen_q].
bool lse_in(const at::Tensor &lse, const at::Tensor &q, fc_attention_args &f) {
    const int64_t want[3] = {f.q.shape[0], f.q.shape[2], f.q.shape[1]};
    return plain(lse, q.device()) && lse.scalar_type() == at::kFloat && lse.sizes() == at::IntArrayRef(want) &&
           view(lse, false, FC_DTYPE_F32, f.lse);
}

// attention_bwd: (dq, dk, dv), new and like q, k, v, or nothing if not taken.
Triple backward(Args a) {
    Options o;
    fc_attention_backward_args args = bwd_init;
    fc_attention_args &f = args.fwd;
    const at::Tensor &q = a[1].toTensor(), &k = a[2].toTensor(), &v = a[3].toTensor();
    if (!options(a.slice(6, kOptions), o) || !operands(q, k, v, o, f) ||
        !like_q(a[4].toTensor(), q, f, o.bhsd, f.out) || !like_q(a[0].toTensor(), q, f, o.bhsd, args.dout) ||
        !lse_in(a[5].toTensor(), q, f))
        return std::nullopt;
    at::Tensor dq = new_output(q, o.bhsd), dk = new_output(k, o.bhsd), dv = new_output(v, o.bhsd);
    view(dq, o.bhsd, f.q.dtype, args.dq);
    view(dk, o.bhsd, f.q.dtype, args.dk);
    view(dv, o.bhsd, f.q.dtype, args.dv);
    args.deterministic = o.deterministic ? 1 : 0;
    // cuda_path is the forward's: the backward picks its own kernel family
    if (!run(api.backward, args, q.device(), 0)) return std::nullopt;
    return std::make_tuple(std::move(dq), std::move(dk), std::move(dv));
}

void attention_fwd(const c10::OperatorHandle &, c10::DispatchKeySet, Stack *stack) {
    static const c10::OperatorHandle py =
        c10::Dispatcher::singleton().findSchemaOrThrow("flashcore::_attention_fwd_py", "");
    Pair res = forward(torch::jit::last(stack, kFwdArgs));
    if (!res) return python_kernel(py, stack);
    torch::jit::drop(stack, kFwdArgs);
    torch::jit::push(stack, std::move(std::get<0>(*res)), std::move(std::get<1>(*res)));
}

void attention_bwd(const c10::OperatorHandle &, c10::DispatchKeySet, Stack *stack) {
    static const c10::OperatorHandle py =
        c10::Dispatcher::singleton().findSchemaOrThrow("flashcore::_attention_bwd_py", "");
    Triple res = backward(torch::jit::last(stack, kBwdArgs));
    if (!res) return python_kernel(py, stack);
    torch::jit::drop(stack, kBwdArgs);
    torch::jit::push(stack, std::move(std::get<0>(*res)), std::move(std::get<1>(*res)),
                     std::move(std::get<2>(*res)));
}

// ---- autograd

// Does autograd record this call: grad mode on and a tensor that requires
// grad (the test of the ops' Python autograd kernel, torch.library's)?
bool records(Args a) {
    if (!c10::GradMode::is_enabled()) return false;
    for (const c10::IValue &x : a)
        if (x.isTensor() && x.toTensor().requires_grad()) return true;
    return false;
}

// What a dense CPU or CUDA tensor's dispatch keys may hold (an inference
// tensor holds fewer): the backend bits, Dense, autograd, ADInplaceOrView
// and autocast. A Python subclass (a fake tensor), a functorch wrapper, a
// functional or a negative view hold more.
const uint64_t kDenseKeys =
    (c10::DispatchKeySet({c10::DispatchKey::Dense, c10::DispatchKey::AutogradFunctionality,
                          c10::DispatchKey::ADInplaceOrView}) |
     c10::autocast_dispatch_keyset | c10::DispatchKeySet(c10::DispatchKeySet::RAW, c10::full_backend_mask))
        .raw_repr();

bool dense(const at::Tensor &t) { return t.defined() && (t.key_set().raw_repr() & ~kDenseKeys) == 0; }

// An attention_fwd call autograd records that the formula below takes: a
// dense call (no paged cache: its backward raises in the Python formula) on
// plain tensors, under no torch function or dispatch mode (a tracer, fake
// tensors, a mode that watches the ops: they keep the Python formula).
bool cpp_formula(Args a) {
    if (!a[3 + kOptions].isNone() || !a[4 + kOptions].isNone()) return false;  // block_table, seqused_k
    if (at::impl::torch_function_mode_enabled() || c10::impl::dispatch_mode_enabled()) return false;
    for (const c10::IValue &x : a)
        if (x.isTensor() && !dense(x.toTensor())) return false;
    return true;
}

const c10::OperatorHandle &bwd_op() {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow("flashcore::attention_bwd", "");
    return op;
}

}  // namespace

namespace flashcore {

// register_autograd's formula (_torch_ops._setup_context, _backward_rule)
// in C++: eager training pays the Python autograd kernel's ~100 us per
// call otherwise. The options after q, k, v ride along as one non-tensor
// argument; the backward is the op attention_bwd, as there. Named
// outside the anonymous namespace: grad_fn.name() says
// "CppNode<flashcore::AttentionBackward>".
struct AttentionBackward : torch::autograd::Function<AttentionBackward> {
    static torch::autograd::variable_list forward(torch::autograd::AutogradContext *ctx,
                                                  const c10::OperatorHandle &op, const at::Tensor &q,
                                                  const at::Tensor &k, const at::Tensor &v, const Stack &rest) {
        Stack s{q, k, v};
        s.insert(s.end(), rest.begin(), rest.end());
        op.callBoxed(&s);  // grad mode is off here: the autograd kernel redispatches below itself
        at::Tensor out = s[0].toTensor(), lse = s[1].toTensor();
        ctx->save_for_backward({q, k, v, out, lse});
        c10::impl::GenericList opts(c10::AnyType::get());
        for (size_t i = 0; i < kOptions; i++) opts.push_back(rest[i]);
        ctx->saved_data["opts"] = std::move(opts);
        ctx->mark_non_differentiable({lse});
        return {out, lse};
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                   torch::autograd::variable_list grads) {
        torch::autograd::variable_list saved = ctx->get_saved_variables();
        at::Tensor dout = grads[0];
        if (dout.stride(-1) != 1) dout = dout.contiguous();  // a broadcast dout: stride 0 everywhere
        Stack s{dout};
        s.insert(s.end(), saved.begin(), saved.end());
        for (const c10::IValue &x : ctx->saved_data["opts"].toListRef()) s.push_back(x);
        bwd_op().callBoxed(&s);
        return {at::Tensor(), s[0].toTensor(), s[1].toTensor(), s[2].toTensor(), at::Tensor()};
    }
};

}  // namespace flashcore

namespace {

// Both ops' AutogradCPU and AutogradCUDA kernel. A compiled graph's calls
// (grad off, or nothing requiring grad) take the redispatch below autograd
// that the Python autograd kernel would make, without its Python. A
// recorded attention_fwd call cpp_formula takes runs flashcore::AttentionBackward;
// every other recorded call goes to the Python autograd kernel
// (register_autograd's formula): registered for the alias key Autograd, it
// still serves AutogradOther.
void autograd(const c10::OperatorHandle &op, c10::DispatchKeySet ks, Stack *stack) {
    const c10::DispatchKeySet below = ks & c10::after_autograd_keyset;
    const size_t n = op.schema().arguments().size();
    Args a = torch::jit::last(stack, n);
    if (records(a)) {
        if (n != kFwdArgs || !cpp_formula(a))  // kFwdArgs: attention_fwd (attention_bwd has kBwdArgs)
            return op.redispatchBoxed(below | c10::DispatchKeySet(c10::DispatchKey::AutogradOther), stack);
        Stack rest(a.begin() + 3, a.end());
        auto res = flashcore::AttentionBackward::apply(op, a[0].toTensor(), a[1].toTensor(), a[2].toTensor(),
                                                       rest);
        torch::jit::drop(stack, n);
        torch::jit::push(stack, std::move(res[0]), std::move(res[1]));
        return;
    }
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(below, stack);
}

// One dispatch key's kernels; dropping them gives the key back to the ops'
// Python kernels (registered for CompositeExplicitAutograd and Autograd).
std::unique_ptr<torch::Library> kernels_for(c10::DispatchKey key) {
    auto m = std::make_unique<torch::Library>(torch::Library::IMPL, "flashcore", key, __FILE__, __LINE__);
    const bool grad = key == c10::DispatchKey::AutogradCPU || key == c10::DispatchKey::AutogradCUDA;
    m->impl("attention_fwd", grad ? torch::CppFunction::makeFromBoxedFunction<&autograd>()
                                  : torch::CppFunction::makeFromBoxedFunction<&attention_fwd>());
    m->impl("attention_bwd", grad ? torch::CppFunction::makeFromBoxedFunction<&autograd>()
                                  : torch::CppFunction::makeFromBoxedFunction<&attention_bwd>());
    return m;
}

}  // namespace

// ---- what _torch_ext.py calls through ctypes

extern "C" {

// The sizes the binding compares with its ctypes mirrors of the same
// structs before it hands anything over.
void fc_ext_layout(int64_t *out) {
    out[0] = sizeof(fc_attention_args);
    out[1] = sizeof(fc_attention_backward_args);
    out[2] = sizeof(fc_kernel_info);
    out[3] = sizeof(fc_tuning);
    out[4] = sizeof(fc_ext_thread);
    out[5] = offsetof(fc_ext_thread, info);
}

// fns: the library's entry points in Api's order; tuning: what a new thread
// context starts from (NULL: the defaults). Nothing is registered until
// fc_ext_enable.
void fc_ext_init(void *const *fns, const fc_tuning *tuning) {
    static_assert(sizeof(Api) == 9 * sizeof(void *), "Api: nine entry points");
    std::memcpy(&api, fns, sizeof api);
    api.args_init(&fwd_init);
    api.bwd_args_init(&bwd_init);
    has_env_tuning = tuning != nullptr;
    if (tuning) env_tuning = *tuning;
}

// Register the kernels (on) or drop them; the binding serialises the calls.
void fc_ext_enable(int on) {
    if (!on) {
        for (auto &r : registered) r.reset();
    } else if (!registered[0]) {
        for (int i = 0; i < 4; i++) registered[i] = kernels_for(kKeys[i]);
    }
}

// This thread's state (its context made if need be), or NULL.
fc_ext_thread *fc_ext_thread_state(void) {
    fc_ext_thread *t = thread_state();
    if (t) owner().bound = true;  // only the binding asks: its _Context takes it
    return t;
}

// The binding's context of this thread, made before the kernels were
// loaded, becomes this thread's (freed at thread exit here).
fc_ext_thread *fc_ext_adopt(fc_context *ctx, int32_t device, int32_t cuda_path) {
    fc_ext_thread &s = owner().s;
    if (s.ctx && s.ctx != ctx) api.context_free(s.ctx);
    s.ctx = ctx;
    s.device = device;
    s.cuda_path = cuda_path;
    owner().bound = true;
    return &s;
}

// A stand-in for fc_attention_forward that answers FC_OK at once (zeroed
// kernel info): benchmarks of the host time around the library hand it to
// the binding's Python path and to fc_ext_stub_forward.
fc_status fc_ext_stub_entry(fc_context *, const fc_attention_args *, void *, fc_kernel_info *info) {
    std::memset(info, 0, sizeof *info);
    return FC_OK;
}

// Benchmarks: the kernels here (the op's and the eager call) run
// fc_ext_stub_entry in place of the library's forward (on), or the
// library's again (off).
void fc_ext_stub_forward(int on) {
    static decltype(api.forward) library = nullptr;
    if (!library) library = api.forward;
    api.forward = on ? &fc_ext_stub_entry : library;
}

}  // extern "C"

#ifdef FLASHCORE_EAGER
// ---- flashcore.attention's eager call
//
// _attention.attention hands it every argument, in its signature's order
// (EagerArg), before anything else (outside torch.compile). The call it
// takes is run here as the binding's Python would run it: the same checks
// (those above), the same args, out and lse made as there (new_output; lse
// only when asked) or the caller's out, the library's forward on torch's
// current stream with the GIL released. It takes a call
// on torch tensors (not a subclass; a dense CPU or CUDA tensor's keys
// only) that autograd does not record, under no torch function or dispatch
// mode, without varlen offsets, appended keys or FP8 options, whose options
// have the types of the defaults (bool, a tuple of two ints or None, float
// or int, str, int or None), on a thread whose binding context is the one
// here (bound). Every other call, and one the library refuses, answers
// None: the Python path runs it, and raises its errors.

namespace {

enum EagerArg {
    kQ, kK, kV, kCausal, kWindow, kSoftcap, kScale, kCuSeqlensQ, kCuSeqlensK, kMaxSeqlenQ, kMaxSeqlenK,
    kReturnLse, kBackend, kOut, kLayout, kCudaPath, kDeterministic, kBlockTable, kSequsedK, kKNew, kVNew,
    kRotaryCos, kRotarySin, kRotaryInterleaved, kQDescale, kKDescale, kVDescale, kOutDtype, kReturnAmax,
    kEagerArgs
};

// o's tensor where o is a torch.Tensor (or Parameter) with dense keys only.
const at::Tensor *tensor_arg(PyObject *o) {
    if (!THPVariable_CheckExact(o)) return nullptr;
    const at::Tensor &t = THPVariable_Unpack(o);
    return dense(t) ? &t : nullptr;
}

// An optional tensor argument: true with nullptr for None.
bool optional_tensor(PyObject *o, const at::Tensor *&t) {
    t = o == Py_None ? nullptr : tensor_arg(o);
    return o == Py_None || t;
}

bool int32_arg(PyObject *o, int32_t &v) {
    if (!PyLong_CheckExact(o)) return false;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || !int32_ok(x)) return false;
    v = static_cast<int32_t>(x);
    return true;
}

// A float or an int as the double float() makes of it.
bool number_arg(PyObject *o, double &x) {
    if (PyFloat_CheckExact(o)) {
        x = PyFloat_AS_DOUBLE(o);
        return true;
    }
    if (!PyLong_CheckExact(o)) return false;
    x = PyLong_AsDouble(o);
    if (x == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
    }
    return true;
}

bool str_arg(PyObject *o, std::string_view &s) {
    if (!PyUnicode_CheckExact(o)) return false;
    Py_ssize_t n = 0;
    const char *p = PyUnicode_AsUTF8AndSize(o, &n);
    if (!p) {
        PyErr_Clear();
        return false;
    }
    s = std::string_view(p, static_cast<size_t>(n));
    return true;
}

// The options (_request.common, _fill_options, check_names,
// _context.cuda_path_value), where the Python path would take them as
// they are; false for a call the Python path runs.
bool eager_options(PyObject *const *a, Options &o) {
    for (int i : {kCuSeqlensQ, kCuSeqlensK, kMaxSeqlenQ, kMaxSeqlenK, kKNew, kVNew, kRotaryCos, kRotarySin,
                  kQDescale, kKDescale, kVDescale, kOutDtype})
        if (a[i] != Py_None) return false;
    if (a[kReturnAmax] != Py_False || (a[kCausal] != Py_True && a[kCausal] != Py_False) ||
        (a[kReturnLse] != Py_True && a[kReturnLse] != Py_False))
        return false;
    o.causal = a[kCausal] == Py_True;
    o.window_left = o.window_right = -1;
    PyObject *w = a[kWindow];
    if (w != Py_None && !(PyTuple_CheckExact(w) && PyTuple_GET_SIZE(w) == 2 &&
                          int32_arg(PyTuple_GET_ITEM(w, 0), o.window_left) &&
                          int32_arg(PyTuple_GET_ITEM(w, 1), o.window_right)))
        return false;
    double softcap = 0.0, scale = 0.0;
    if ((a[kSoftcap] != Py_None && !number_arg(a[kSoftcap], softcap)) ||
        (a[kScale] != Py_None && !number_arg(a[kScale], scale)))
        return false;
    if (!float32_ok(scale, o.scale) || !float32_ok(softcap, o.softcap)) return false;
    std::string_view backend, layout;
    if (!str_arg(a[kBackend], backend) || !str_arg(a[kLayout], layout)) return false;
    o.backend = backend_code(backend);
    o.bhsd = same_lower(layout, "bhsd");
    if (o.backend < 0 || !(o.bhsd || same_lower(layout, "bshd"))) return false;
    int32_t path = 0;
    if (a[kCudaPath] != Py_None && !int32_arg(a[kCudaPath], path)) return false;
    o.cuda_path = path;
    o.deterministic = false;  // the backward's: an eager forward has none
    return path == 0 || path == 80 || path == 90;
}

// The caller's out (_request.output): q's device, dtype and shape, not
// tracked by autograd (the Python path refuses a leaf that requires grad).
bool given_out(const at::Tensor &out, const at::Tensor &q) {
    return !out.requires_grad() && plain(out, q.device()) && out.scalar_type() == q.scalar_type() &&
           out.sizes() == q.sizes();
}

// The tensor as the Python object to return (a new reference), or nullptr.
PyObject *wrap(at::Tensor &&t) { return THPVariable_Wrap(std::move(t)); }

// The call's result (a new reference: out, or (out, lse) with return_lse),
// or nullptr where the Python path runs it.
PyObject *eager_call(PyObject *const *a) {
    Options o;
    if (!eager_options(a, o)) return nullptr;
    const at::Tensor *q = tensor_arg(a[kQ]), *k = tensor_arg(a[kK]), *v = tensor_arg(a[kV]);
    const at::Tensor *table, *used, *given;
    if (!q || !k || !v || !optional_tensor(a[kBlockTable], table) || !optional_tensor(a[kSequsedK], used) ||
        !optional_tensor(a[kOut], given))
        return nullptr;
    // _torch_ops.routes: autograd records the call (the op's path)
    if (c10::GradMode::is_enabled() && (q->requires_grad() || k->requires_grad() || v->requires_grad()))
        return nullptr;
    // a mode sees the Python path's tensor calls: it keeps them
    if (at::impl::torch_function_mode_enabled() || c10::impl::dispatch_mode_enabled()) return nullptr;
    Owner &own = owner();
    if (!own.bound || !own.s.ctx) return nullptr;  // the binding's context() binds it first
    fc_attention_args args = fwd_init;
    const at::Device dev = q->device();
    if (!operands(*q, *k, *v, o, args) || !paged(table, used, dev, args) || (given && !given_out(*given, *q)))
        return nullptr;
    at::Tensor out = given ? *given : new_output(*q, o.bhsd);
    if (!view(out, o.bhsd, args.q.dtype, args.out)) return nullptr;
    const bool want_lse = a[kReturnLse] == Py_True;
    at::Tensor lse;
    if (want_lse) {
        lse = at::empty({args.q.shape[0], args.q.shape[2], args.q.shape[1]}, q->options().dtype(at::kFloat));
        view(lse, false, FC_DTYPE_F32, args.lse);
    }
    void *stream = stream_of(dev);
    // the Python objects first: once the library has run, nothing fails
    if (given) Py_INCREF(a[kOut]);
    PyObject *res = given ? a[kOut] : wrap(std::move(out));
    PyObject *res_lse = res && want_lse ? wrap(std::move(lse)) : nullptr;
    PyObject *pair = res_lse ? PyTuple_New(2) : nullptr;
    bool ok = res && (!want_lse || pair);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        ok = run_on(&own.s, api.forward, args, dev, o.cuda_path, stream);
        Py_END_ALLOW_THREADS
    }
    if (!ok) {  // refused (or no memory for the objects): the Python path runs it
        PyErr_Clear();
        Py_XDECREF(pair);
        Py_XDECREF(res_lse);
        Py_XDECREF(res);
        return nullptr;
    }
    own.eager_calls++;
    if (!pair) return res;
    PyTuple_SET_ITEM(pair, 0, res);
    PyTuple_SET_ITEM(pair, 1, res_lse);
    return pair;
}

// The Python function: eager_call's result, or None.
PyObject *eager_attention(PyObject *, PyObject *const *a, Py_ssize_t n) {
    if (n != kEagerArgs) {
        PyErr_Format(PyExc_TypeError, "flashcore's eager call takes %d arguments, got %zd", int(kEagerArgs), n);
        return nullptr;
    }
    PyObject *res = nullptr;
    try {
        res = eager_call(a);
    } catch (...) {  // torch refused something (an allocation): the Python path says what
        res = nullptr;
    }
    if (res) return res;
    Py_RETURN_NONE;
}

PyMethodDef eager_def = {"attention_eager",
                         reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&eager_attention)), METH_FASTCALL,
                         "flashcore.attention's arguments in order: its result, or None (not taken)."};

}  // namespace

// The eager call as a Python function (a new reference); _torch_ext calls
// it through ctypes.PyDLL (the GIL held).
extern "C" PyObject *fc_ext_eager(void) { return PyCFunction_New(&eager_def, nullptr); }

// How many calls the eager call ran on this thread (tests).
extern "C" int64_t fc_ext_eager_calls(void) { return owner().eager_calls; }
#endif  // FLASHCORE_EAGER
