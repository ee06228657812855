#include "nn/pipeline_tick_loop.hpp"

#include <string>

#include "dsl/autodiff.hpp"
#include "dsl/error.hpp"
#include "nn/zero_sums.hpp"

namespace tessera {

// One call's new values: its forward's (the stage input it kept, the stacked output), its loss
// and the last part's gradient terms, its backward's (d stage input, the stages' and the first
// part's gradient terms), as far as its phase runs them.
struct PipelineTickLoop::CallValues {
  std::optional<Tensor> kept_input, forward_output, loss, input_cotangent;
  std::vector<Tensor> first_terms, stage_terms, last_terms;
};

namespace {

// [P] bool: stage s holds a microbatch, microbatches[s] in [0, count).
Tensor holding(const Tensor& microbatches, int64_t count) {
  const Tensor started = microbatches >= 0;
  return where(started, microbatches < count, started);
}

// The given tensors with `tail` after them.
std::vector<Tensor> followed_by(std::vector<Tensor> head, const std::vector<Tensor>& tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

std::vector<Tensor> values(const std::vector<Variable>& variables) { return std::vector<Tensor>(variables.begin(), variables.end()); }

}  // namespace

PipelineTickLoop::PipelineTickLoop(int64_t stages, int64_t microbatches) : stages_(stages), microbatches_(microbatches) {
  if (stages < 2 || microbatches < 1)
    throw Error("PipelineTickLoop: a host loop of 1F1B ticks needs at least 2 stages and 1 microbatch, got " + std::to_string(stages) +
                " and " + std::to_string(microbatches));
}

int64_t PipelineTickLoop::calls(PipelineTickPhase phase) const { return phase == PipelineTickPhase::Steady ? microbatches_ : stages_ - 1; }

PipelineTickPhase PipelineTickLoop::phase_of_call(int64_t call) const {
  if (call < stages_ - 1) return PipelineTickPhase::WarmUp;
  return call < stages_ - 1 + microbatches_ ? PipelineTickPhase::Steady : PipelineTickPhase::CoolDown;
}

PipelineTickLoop::CallValues PipelineTickLoop::call_values(PipelineTickPhase phase, const PipelineTickModel& model) const {
  const Carried& c = *carried_;
  const Mesh& mesh = model.state_layout.mesh();
  const int64_t p = stages_, count = microbatches_;
  const std::string& dim = model.mesh_dim;
  const Tensor n = c.counter.value();
  CallValues out;

  // Forward tick n: stage s runs microbatch n - s; stage 0 takes microbatch n, the others what
  // the stage before handed on (run_pipeline_1f1b's forward tick, its masks from the counter).
  if (phase != PipelineTickPhase::CoolDown) {
    const Tensor indices = stage_indices(mesh, dim);
    const Tensor fed = on_every_stage(model.first(n), p);
    std::vector<bool> others(size_t(p), true);
    others[0] = false;
    Tensor stacked = where(stage_mask(indices, others, fed.shape()), shift_to_next_stage(c.forward_output.value(), model.state_layout, dim), fed);
    stacked = where(stage_mask(holding(n - indices, count), stacked.shape()), stacked, 0.0);
    out.kept_input = stop_gradient(with_layout(stacked, model.state_layout));
    out.forward_output = model.stages(*out.kept_input, 0);
  }
  // The loss of microbatch n - P + 1, which this forward tick finishes on the last stage.
  std::optional<Tensor> loss_cotangent;
  if (phase == PipelineTickPhase::Steady) {
    const Tensor last_output = stop_gradient(stage_slot(*out.forward_output, p - 1, dim));
    out.loss = model.loss(last_output, n - (p - 1));
    std::vector<Tensor> g = gradients(*out.loss / double(count), followed_by({last_output}, model.last_parameters));
    loss_cotangent = g.front();
    out.last_terms.assign(g.begin() + 1, g.end());
  }
  // Backward tick n - P + 1: stage s runs microbatch n - 2P + 2 + s from the input it kept at
  // forward tick n - 2P + 2 + 2s (slot 2s; the last stage's is this call's own), the last stage
  // taking the loss's cotangent, the others the cotangent the stage after handed back.
  if (phase != PipelineTickPhase::WarmUp) {
    // Masks of the backward's own: its nodes must not be the forward's (hash-consing), or
    // autodiff's sums regroup.
    const Tensor salted = stage_indices(mesh, dim, 2 * p);
    const Tensor busy = holding(salted + (n - (2 * p - 2)), count);
    std::optional<Tensor> input;
    for (int64_t s = 0; s < p; ++s) {
      const std::optional<Tensor> kept = s + 1 < p ? std::optional<Tensor>(c.kept[size_t(2 * s)].value()) : out.kept_input;
      if (!kept) continue;  // the cool-down's last stage holds nothing
      const Tensor on_s = salted == s;
      const Tensor mask = stage_mask(where(on_s, busy, on_s), kept->shape());
      input = input ? where(mask, *kept, *input) : where(mask, *kept, 0.0);
    }
    const Tensor handed_back = shift_to_previous_stage(c.input_cotangent.value(), model.state_layout, dim);
    Tensor cotangent = handed_back;
    if (loss_cotangent) {
      const Tensor fed = on_every_stage(*loss_cotangent, p);
      std::vector<bool> last(size_t(p), false);
      last.back() = true;
      cotangent = where(stage_mask(salted, last, fed.shape()), fed, handed_back);
    }
    cotangent = where(stage_mask(busy, cotangent.shape()), cotangent, 0.0);
    const Tensor stage_input = stop_gradient(with_layout(*input, model.state_layout));
    const Tensor stage_output = model.stages(stage_input, 1);
    // A vector-Jacobian product as a gradient: d sum(y * c) / d x with c held constant.
    std::vector<Tensor> g = gradients(reduce_sum(stage_output * stop_gradient(with_layout(cotangent, model.state_layout))),
                                      followed_by({stage_input}, model.stage_parameters));
    out.input_cotangent = g.front();
    out.stage_terms.assign(g.begin() + 1, g.end());
    // Stage 0 finishes microbatch n - 2P + 2 here: into the first part. Before the first one
    // finishes, stage 0 is idle, its cotangent zero and so are these terms.
    out.first_terms =
        gradients(reduce_sum(model.first(n - (2 * p - 2)) * stop_gradient(stage_slot(g.front(), 0, dim))), model.first_parameters);
  }
  return out;
}

void PipelineTickLoop::prepare(const PipelineTickModel& model) {
  if (carried_) return;
  const Mesh& mesh = model.state_layout.mesh();
  const Tensor counter = zeros({}, Layout::replicated(mesh, 0), DType::i32);
  const Tensor first = model.first(counter);  // a graph only: never run
  std::vector<int64_t> shape = first.shape();
  shape.insert(shape.begin(), stages_);
  auto state = [&] { return Variable(zeros(shape, model.state_layout, first.dtype())); };
  std::vector<Variable> kept;
  for (int64_t slot = 0; slot < 2 * stages_ - 2; ++slot) kept.push_back(state());
  // The input cotangent and the loss sum start as stand-ins the probe below reads (or not); they
  // are made again in the layouts it gives.
  carried_.emplace(Carried{Variable(counter), state(), state(), std::move(kept), Variable(counter), {}, {}, {}});
  // The sums in the layouts a steady call computes its terms in (gradient_as_computed): a sum
  // pending over dp stays pending until the update hands it out, as gradient accumulation's do.
  const CallValues probe = call_values(PipelineTickPhase::Steady, model);
  std::vector<Tensor> terms{*probe.loss};
  for (const auto* part : {&probe.first_terms, &probe.stage_terms, &probe.last_terms})
    for (const Tensor& t : *part) terms.push_back(gradient_as_computed(t));
  terms.push_back(*probe.input_cotangent);
  std::vector<NodeRef> nodes;
  for (const Tensor& t : terms) nodes.push_back(t.node());
  const std::vector<Layout> layouts = planned_layouts(nodes);  // one propagation for them all
  auto sum = [&](size_t k) { return Variable(zeros(terms[k].shape(), layouts[k], terms[k].dtype())); };
  Carried& c = *carried_;
  // The input cotangent too, as the backward computes it (a sum pending over tp, say): the next
  // call's shift reads it in whatever layout it needs.
  c.input_cotangent = sum(terms.size() - 1);
  c.loss_sum = sum(0);
  size_t k = 1;
  for (auto [sums, part] : {std::pair{&c.first_sums, &probe.first_terms}, std::pair{&c.stage_sums, &probe.stage_terms},
                            std::pair{&c.last_sums, &probe.last_terms}})
    for (size_t i = 0; i < part->size(); ++i) sums->push_back(sum(k++));
}

std::vector<Tensor> PipelineTickLoop::call(PipelineTickPhase phase, const PipelineTickModel& model) {
  if (!carried_) throw Error("PipelineTickLoop: a call before prepare()");
  Carried& c = *carried_;
  const CallValues v = call_values(phase, model);
  auto add_into = [](std::vector<Variable>& sums, const std::vector<Tensor>& terms) {
    for (size_t i = 0; i < sums.size(); ++i) sums[i].assign(sums[i].value() + gradient_as_computed(terms[i]));
  };
  if (v.forward_output) c.forward_output.assign(*v.forward_output);
  if (v.loss) {
    c.loss_sum.assign(c.loss_sum.value() + *v.loss);
    add_into(c.last_sums, v.last_terms);
  }
  if (v.input_cotangent) {
    c.input_cotangent.assign(*v.input_cotangent);
    add_into(c.stage_sums, v.stage_terms);
    add_into(c.first_sums, v.first_terms);
  }
  const Tensor next = c.counter.value() + 1;
  c.counter.assign(where(next == microbatches_ + 2 * stages_ - 2, 0, next));
  return v.kept_input ? std::vector<Tensor>{*v.kept_input} : std::vector<Tensor>{};
}

void PipelineTickLoop::advance(const std::vector<Tensor>& kept_input) {
  std::vector<Variable>& kept = carried_.value().kept;
  // Moved, not copied: each slot takes the next one's value; the oldest, no longer read, is
  // dropped (or goes round to the last slot in the cool-down, where nothing reads it).
  const Tensor oldest = kept.front().value();
  for (size_t i = 0; i + 1 < kept.size(); ++i) kept[i].assign(kept[i + 1].value());
  kept.back().assign(kept_input.empty() ? oldest : kept_input.front());
}

std::vector<Variable> PipelineTickLoop::slots_read_later() const {
  std::vector<Variable> out;
  const std::vector<Variable>& kept = carried_.value().kept;
  for (size_t slot = 1; slot < kept.size(); slot += 2) out.push_back(kept[slot]);
  return out;
}

PipelineGradients PipelineTickLoop::sums(const std::vector<Tensor>& first_parameters, const std::vector<Tensor>& stage_parameters,
                                         const std::vector<Tensor>& last_parameters) const {
  const Carried& c = carried_.value();
  PipelineGradients out{c.loss_sum.value() / double(microbatches_), values(c.first_sums), values(c.stage_sums), values(c.last_sums)};
  for (auto [sums, parameters] :
       {std::pair{&out.first, &first_parameters}, std::pair{&out.stages, &stage_parameters}, std::pair{&out.last, &last_parameters}})
    for (size_t i = 0; i < sums->size(); ++i) (*sums)[i] = hand_out_gradient((*sums)[i], (*parameters)[i].layout().without_partial());
  return out;
}

void PipelineTickLoop::zero_sums() {
  Carried& c = carried_.value();
  std::vector<Variable*> sums;
  for (auto* part : {&c.first_sums, &c.stage_sums, &c.last_sums})
    for (Variable& sum : *part) sums.push_back(&sum);
  sums.push_back(&c.loss_sum);
  tessera::zero_sums(sums);
}

}  // namespace tessera
