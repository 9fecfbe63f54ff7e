// The TensorFlow ops of dtrain.tensorflow: DtrainAllreduce, DtrainReducescatter, DtrainBroadcast,
// DtrainAllgather, DtrainAlltoall, DtrainJoin. Each kernel is asynchronous: it hands its tensors to
// the session (session.h) and finishes from the coordinator's callback, so a graph's other ops keep
// TensorFlow's threads. The library registers them when tf.load_op_library loads it
// (python/dtrain/tensorflow/_ops.py), before Python imports the same file as dtrain._tensorflow.
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/error.h"
#include "python/tensorflow/session.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace dtrain::python::tensorflow {
namespace {

namespace tf = ::tensorflow;
using tf::shape_inference::InferenceContext;

// dtrain's type for a TensorFlow dtype; `bytes`: one that no reduction needs may travel as bytes.
std::optional<DType> dtype_of(tf::DataType t) {
  switch (t) {
    case tf::DT_FLOAT:
      return DType::kF32;
    case tf::DT_DOUBLE:
      return DType::kF64;
    case tf::DT_HALF:
      return DType::kF16;
    case tf::DT_BFLOAT16:
      return DType::kBF16;
    case tf::DT_INT8:
      return DType::kI8;
    case tf::DT_UINT8:
      return DType::kU8;
    case tf::DT_INT16:
      return DType::kI16;
    case tf::DT_INT32:
      return DType::kI32;
    case tf::DT_INT64:
      return DType::kI64;
    default:
      return std::nullopt;
  }
}

// The tensor as dtrain sees it: its own type, or its bytes for a type only moved (bool, ...).
TensorView view_of(const tf::Tensor& t) {
  if (auto d = dtype_of(t.dtype()))
    return TensorView{const_cast<char*>(t.tensor_data().data()),
                      static_cast<size_t>(t.NumElements()), *d};
  return TensorView::raw(const_cast<char*>(t.tensor_data().data()), t.TotalBytes());
}

// The tensor's shape as view_of(t) sees it: a type moved as bytes gets a last dimension of its
// element's bytes (a scalar becomes one row of them), so that rows keep their meaning.
std::vector<int64_t> shape_of(const tf::Tensor& t) {
  std::vector<int64_t> shape;
  for (int d = 0; d < t.dims(); ++d) shape.push_back(t.dim_size(d));
  if (!dtype_of(t.dtype())) {
    if (shape.empty()) shape.push_back(1);
    shape.push_back(static_cast<int64_t>(tf::DataTypeSize(t.dtype())));
  }
  return shape;
}

// An error as TensorFlow's Status, dtrain's text kept whole. `agreed`: the call was queued, so
// an InvalidArgumentError means the ranks' calls differed, which Horovod reports as a failed
// precondition; before queueing it is this rank's own argument.
tf::Status status_of(std::exception_ptr error, bool agreed) {
  try {
    std::rethrow_exception(error);
  } catch (const InvalidArgumentError& e) {
    return agreed ? absl::FailedPreconditionError(e.what()) : absl::InvalidArgumentError(e.what());
  } catch (const TimeoutError& e) {
    return absl::DeadlineExceededError(e.what());
  } catch (const PeerFailureError& e) {
    return absl::UnavailableError(e.what());
  } catch (const AbortedError& e) {
    return absl::AbortedError(e.what());
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
}

// What every kernel shares: the call's name, the session, and the finishing of the kernel.
class CollectiveKernel : public tf::AsyncOpKernel {
 public:
  explicit CollectiveKernel(tf::OpKernelConstruction* c) : AsyncOpKernel(c) {
    std::string given;
    OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &given));
    // A graph's node names are unique and the same on every rank that built the same graph.
    call_name_ = given.empty() ? name() : given;
  }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) final {
    std::shared_ptr<Session> session = Session::current();
    OP_REQUIRES_ASYNC(ctx, session != nullptr,
                      absl::FailedPreconditionError(
                          "dtrain.tensorflow has not been initialized: call hvd.init() (as "
                          "dtrain.tensorflow.init()) before the first collective"),
                      done);
    // Called once, from the coordinator's thread (or below when the call never got queued).
    auto finish = [ctx, done](std::exception_ptr error) {
      if (error) ctx->SetStatus(status_of(error, true));
      done();
    };
    try {
      start(*session, ctx, std::move(finish));
    } catch (...) {
      ctx->SetStatus(status_of(std::current_exception(), false));
      done();
    }
  }

 protected:
  virtual void start(Session& session, tf::OpKernelContext* ctx, Session::Done finish) = 0;
  const std::string& call_name() const { return call_name_; }

  // The input copied into output 0, unless TensorFlow lets the output take the input's buffer.
  static tf::Tensor* in_place_output(tf::OpKernelContext* ctx) {
    const tf::Tensor& in = ctx->input(0);
    tf::Tensor* out = nullptr;
    auto status = ctx->forward_input_or_allocate_output({0}, 0, in.shape(), &out);
    if (!status.ok()) throw InvalidArgumentError(std::string(status.message()));
    if (out->tensor_data().data() != in.tensor_data().data() && in.TotalBytes() > 0)
      std::memcpy(const_cast<char*>(out->tensor_data().data()), in.tensor_data().data(),
                  in.TotalBytes());
    return out;
  }

  // Output `index`: `rows` rows shaped as the input's after dimension 0. Called from the
  // coordinator's thread, before the kernel is done.
  static TensorView rows_output(tf::OpKernelContext* ctx, int index, int64_t rows) {
    tf::TensorShape shape = ctx->input(0).shape();
    if (shape.dims() == 0) shape.AddDim(1);
    shape.set_dim(0, rows);
    tf::Tensor* out = nullptr;
    auto status = ctx->allocate_output(index, shape, &out);
    if (!status.ok()) throw ResourceExhaustedError(std::string(status.message()));
    return view_of(*out);
  }

 private:
  std::string call_name_;
};

// A kernel whose op has a reduction (attribute reduce_op: dtrain's ReduceOp code).
class ReducingKernel : public CollectiveKernel {
 public:
  explicit ReducingKernel(tf::OpKernelConstruction* c) : CollectiveKernel(c) {
    int64_t op = 0;
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &op));
    op_ = static_cast<ReduceOp>(op);
  }

 protected:
  ReduceOp op_ = ReduceOp::kSum;
};

class AllreduceKernel : public ReducingKernel {
 public:
  using ReducingKernel::ReducingKernel;

 private:
  void start(Session& session, tf::OpKernelContext* ctx, Session::Done finish) override {
    tf::Tensor* out = in_place_output(ctx);
    session.allreduce(call_name(), view_of(*out), shape_of(*out), op_, std::move(finish));
  }
};

class BroadcastKernel : public CollectiveKernel {
 public:
  explicit BroadcastKernel(tf::OpKernelConstruction* c) : CollectiveKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_));
  }

 private:
  void start(Session& session, tf::OpKernelContext* ctx, Session::Done finish) override {
    tf::Tensor* out = in_place_output(ctx);
    session.broadcast(call_name(), view_of(*out), shape_of(*out), root_, std::move(finish));
  }
  int root_ = 0;
};

class AllgatherKernel : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;

 private:
  void start(Session& session, tf::OpKernelContext* ctx, Session::Done finish) override {
    const tf::Tensor& in = ctx->input(0);
    session.allgather(
        call_name(), view_of(in), shape_of(in),
        [ctx](int64_t rows) { return rows_output(ctx, 0, rows); }, std::move(finish));
  }
};

class ReducescatterKernel : public ReducingKernel {
 public:
  using ReducingKernel::ReducingKernel;

 private:
  void start(Session& session, tf::OpKernelContext* ctx, Session::Done finish) override {
    const tf::Tensor& in = ctx->input(0);
    session.reducescatter(
        call_name(), view_of(in), shape_of(in), op_,
        [ctx](int64_t rows) { return rows_output(ctx, 0, rows); }, std::move(finish));
  }
};

class AlltoallKernel : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;

 private:
  void start(Session& session, tf::OpKernelContext* ctx, Session::Done finish) override {
    const tf::Tensor& in = ctx->input(0);
    const tf::Tensor& splits = ctx->input(1);
    std::vector<int64_t> send;
    auto flat = splits.flat<int32_t>();
    for (int64_t i = 0; i < flat.size(); ++i) send.push_back(flat(i));
    auto received = std::make_shared<std::vector<int64_t>>();
    session.alltoall(
        call_name(), view_of(in), shape_of(in), std::move(send),
        [ctx](int64_t rows) { return rows_output(ctx, 0, rows); }, received,
        [ctx, received, finish = std::move(finish)](std::exception_ptr error) {
          if (!error) {
            tf::Tensor* out = nullptr;
            auto status = ctx->allocate_output(
                1, tf::TensorShape({static_cast<int64_t>(received->size())}), &out);
            if (!status.ok()) {
              ctx->SetStatus(status);
            } else {
              for (size_t r = 0; r < received->size(); ++r)
                out->flat<int32_t>()(static_cast<int64_t>(r)) =
                    static_cast<int32_t>((*received)[r]);
            }
          }
          finish(error);
        });
  }
};

class JoinKernel : public tf::AsyncOpKernel {
 public:
  using AsyncOpKernel::AsyncOpKernel;

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    std::shared_ptr<Session> session = Session::current();
    OP_REQUIRES_ASYNC(ctx, session != nullptr,
                      absl::FailedPreconditionError(
                          "dtrain.tensorflow has not been initialized: call hvd.init() first"),
                      done);
    try {
      session->join([ctx, done](std::exception_ptr error, int last_joined) {
        if (error) {
          ctx->SetStatus(status_of(error, true));
        } else {
          tf::Tensor* out = nullptr;
          auto status = ctx->allocate_output(0, tf::TensorShape({}), &out);
          if (status.ok()) out->scalar<int32_t>()() = last_joined;
          ctx->SetStatus(status);
        }
        done();
      });
    } catch (...) {
      ctx->SetStatus(status_of(std::current_exception(), false));
      done();
    }
  }
};

// This rank's place in the session's world (its size when kSize), read when the op runs: a
// graph traced before live recovery re-formed the world (Keras' train function) then divides by
// the size there is now.
template <bool kSize>
class WorldKernel : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(tf::OpKernelContext* ctx) override {
    std::shared_ptr<Session> session = Session::current();
    OP_REQUIRES(ctx, session != nullptr,
                absl::FailedPreconditionError(
                    "dtrain.tensorflow has not been initialized: call hvd.init() first"));
    tf::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &out));
    out->scalar<int32_t>()() = kSize ? session->size() : session->rank();
  }
};

absl::Status same_shape(InferenceContext* c) {
  c->set_output(0, c->input(0));
  return absl::OkStatus();
}

// Dimension 0 unknown until the ranks tell their rows; the others the input's.
absl::Status rows_shape(InferenceContext* c) {
  tf::shape_inference::ShapeHandle output;
  TF_RETURN_IF_ERROR(c->ReplaceDim(c->input(0), 0, c->UnknownDim(), &output));
  c->set_output(0, output);
  return absl::OkStatus();
}

// The types each op takes: reductions need dtrain's arithmetic; moving bytes takes any.
#define DTRAIN_REDUCIBLE "{int8, uint8, int16, int32, int64, float16, bfloat16, float32, float64}"
#define DTRAIN_MOVABLE                                                                      \
  "{int8, uint8, int16, uint16, int32, uint32, int64, uint64, float16, bfloat16, float32, " \
  "float64, bool}"

REGISTER_OP("DtrainAllreduce")
    .Attr("T: " DTRAIN_REDUCIBLE)
    .Attr("reduce_op: int")
    .Attr("tensor_name: string = ''")
    .Input("tensor: T")
    .Output("reduced: T")
    .SetShapeFn(same_shape)
    .Doc("Every rank's tensor reduced with reduce_op (dtrain's ReduceOp), matched by name.");

REGISTER_OP("DtrainReducescatter")
    .Attr("T: " DTRAIN_REDUCIBLE)
    .Attr("reduce_op: int")
    .Attr("tensor_name: string = ''")
    .Input("tensor: T")
    .Output("reduced: T")
    .SetShapeFn(rows_shape)
    .Doc("Every rank's tensor reduced with reduce_op; this rank's part of dimension 0.");

REGISTER_OP("DtrainBroadcast")
    .Attr("T: " DTRAIN_MOVABLE)
    .Attr("root_rank: int")
    .Attr("tensor_name: string = ''")
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn(same_shape)
    .Doc("Rank root_rank's tensor on every rank, matched by name.");

REGISTER_OP("DtrainAllgather")
    .Attr("T: " DTRAIN_MOVABLE)
    .Attr("tensor_name: string = ''")
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn(rows_shape)
    .Doc("Every rank's rows concatenated along dimension 0, matched by name.");

REGISTER_OP("DtrainAlltoall")
    .Attr("T: " DTRAIN_MOVABLE)
    .Attr("tensor_name: string = ''")
    .Input("tensor: T")
    .Input("splits: int32")
    .Output("output: T")
    .Output("received_splits: int32")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(rows_shape(c));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc("splits[j] rows to rank j; what arrived, and how many rows from each rank.");

REGISTER_OP("DtrainJoin")
    .Output("last_joined: int32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc("This rank has no more data: zeros for the others' all-reduces until every rank joins.");

REGISTER_OP("DtrainRank")
    .Output("rank: int32")
    .SetIsStateful()
    .SetShapeFn(tf::shape_inference::ScalarShape)
    .Doc("This process's rank in the session's world when the op runs.");

REGISTER_OP("DtrainSize")
    .Output("size: int32")
    .SetIsStateful()
    .SetShapeFn(tf::shape_inference::ScalarShape)
    .Doc("The number of ranks in the session's world when the op runs.");

REGISTER_KERNEL_BUILDER(Name("DtrainRank").Device(tf::DEVICE_CPU), WorldKernel<false>);
REGISTER_KERNEL_BUILDER(Name("DtrainSize").Device(tf::DEVICE_CPU), WorldKernel<true>);
REGISTER_KERNEL_BUILDER(Name("DtrainAllreduce").Device(tf::DEVICE_CPU), AllreduceKernel);
REGISTER_KERNEL_BUILDER(Name("DtrainReducescatter").Device(tf::DEVICE_CPU), ReducescatterKernel);
REGISTER_KERNEL_BUILDER(Name("DtrainBroadcast").Device(tf::DEVICE_CPU), BroadcastKernel);
REGISTER_KERNEL_BUILDER(Name("DtrainAllgather").Device(tf::DEVICE_CPU), AllgatherKernel);
REGISTER_KERNEL_BUILDER(Name("DtrainAlltoall").Device(tf::DEVICE_CPU), AlltoallKernel);
REGISTER_KERNEL_BUILDER(Name("DtrainJoin").Device(tf::DEVICE_CPU), JoinKernel);

}  // namespace
}  // namespace dtrain::python::tensorflow
