#include "codegen/llvm_renderer.hpp"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include <functional>
#include <map>
#include <set>

#include "dsl/error.hpp"

namespace tessera {
namespace {

using namespace kir;

class FunctionRenderer {
 public:
  FunctionRenderer(const Kernel& kernel, llvm::Function* fn, llvm::Module& module)
      : k_(kernel), fn_(fn), m_(module), ctx_(module.getContext()), b_(ctx_) {}

  void render() {
    auto* entry = llvm::BasicBlock::Create(ctx_, "entry", fn_);
    b_.SetInsertPoint(entry);
    llvm::FastMathFlags fmf;
    // Deterministic kernels neither reassociate nor contract a*b+c into an FMA: whether a
    // product and a sum share a kernel depends on the mesh's fusion, so each must round alone.
    fmf.setAllowContract(!k_.ordered_reductions);
    fmf.setAllowReassoc(!k_.ordered_reductions);
    fmf.setNoSignedZeros(true);
    fmf.setApproxFunc(true);
    b_.setFastMathFlags(fmf);
    auto arg = fn_->arg_begin();
    for (size_t i = 0; i < k_.buffers.size(); ++i) buffers_.push_back(&*arg++);
    params_ = &*arg++;
    begin_ = &*arg++;
    end_ = &*arg++;
    vars_.assign(k_.num_vars, nullptr);
    var_types_.assign(k_.num_vars, nullptr);
    stmt(k_.body);
    b_.CreateRetVoid();
  }

 private:
  llvm::Type* type(Type t) {
    switch (t) {
      case Type::I1: return b_.getInt1Ty();
      case Type::I32: return b_.getInt32Ty();
      case Type::I64: return b_.getInt64Ty();
      case Type::U8: return b_.getInt8Ty();
      case Type::F32: return b_.getFloatTy();
      case Type::F64: return b_.getDoubleTy();
      case Type::BF16: return b_.getInt16Ty();  // raw bits: converted by hand (no libcalls)
      case Type::F16: return b_.getHalfTy();
    }
    throw InternalError("llvm type: bad type");
  }

  llvm::AllocaInst* slot(int v, llvm::Type* t) {
    if (!vars_[v]) {
      llvm::IRBuilder<> entry(&fn_->getEntryBlock(), fn_->getEntryBlock().begin());
      vars_[v] = entry.CreateAlloca(t, nullptr, "v" + std::to_string(v));
      var_types_[v] = t;
    }
    return vars_[v];
  }

  llvm::Value* param(int slot) {
    auto it = params_cache_.find(slot);
    if (it != params_cache_.end()) return it->second;
    llvm::IRBuilder<> entry(ctx_);
    entry.SetInsertPoint(&fn_->getEntryBlock(), fn_->getEntryBlock().getFirstInsertionPt());
    // Params are loaded once, at the top of the function (they never change during a call).
    auto* ptr = entry.CreateConstInBoundsGEP1_64(b_.getInt64Ty(), params_, uint64_t(slot));
    auto* v = entry.CreateLoad(b_.getInt64Ty(), ptr, "p" + std::to_string(slot));
    params_cache_[slot] = v;
    return v;
  }

  llvm::Value* intrinsic(llvm::Intrinsic::ID id, llvm::Value* a, llvm::Value* b = nullptr) {
    llvm::Function* f = llvm::Intrinsic::getDeclaration(&m_, id, {a->getType()});
    return b ? b_.CreateCall(f, {a, b}) : b_.CreateCall(f, {a});
  }

  llvm::Value* bf16_to_f32(llvm::Value* bits) {
    auto* wide = b_.CreateShl(b_.CreateZExt(bits, b_.getInt32Ty()), 16);
    return b_.CreateBitCast(wide, b_.getFloatTy());
  }

  // The bits of a value lowering already rounded to bf16 (kernel_ir.hpp, Store): its high half.
  // A NaN stays a quiet NaN (matches dsl/dtype.cpp).
  llvm::Value* bf16_bits(llvm::Value* f) {
    auto* high = b_.CreateLShr(b_.CreateBitCast(f, b_.getInt32Ty()), 16);
    auto* quiet = b_.CreateOr(high, 0x40);
    auto* is_nan = b_.CreateFCmpUNO(f, f);
    return b_.CreateTrunc(b_.CreateSelect(is_nan, quiet, high), b_.getInt16Ty());
  }

  llvm::Value* cast(llvm::Value* v, Type from, Type to) {
    if (from == to) return v;
    llvm::Type* t = type(to);
    const bool ff = is_float(from), ft = is_float(to);
    if (to == Type::I1) return ff ? b_.CreateFCmpUNE(v, llvm::ConstantFP::get(v->getType(), 0.0))
                                   : b_.CreateICmpNE(v, llvm::ConstantInt::get(v->getType(), 0));
    const bool from_unsigned = from == Type::I1 || from == Type::U8;
    if (ff && ft) return b_.CreateFPCast(v, t);
    if (ff) return to == Type::U8 ? b_.CreateFPToUI(v, t) : b_.CreateFPToSI(v, t);
    if (ft) return from_unsigned ? b_.CreateUIToFP(v, t) : b_.CreateSIToFP(v, t);
    return b_.CreateIntCast(v, t, !from_unsigned);
  }

  llvm::Value* expr(const Expr& e) {
    auto cached = cse_.find(e.get());
    if (cached != cse_.end()) return cached->second;
    llvm::Value* v = expr_uncached(e);
    cse_[e.get()] = v;
    return v;
  }

  llvm::Value* expr_uncached(const Expr& e) {
    const Type t = e->type;
    auto arg = [&](size_t i) { return expr(e->args[i]); };
    switch (e->op) {
      case Op::IntConst: return llvm::ConstantInt::get(type(t), uint64_t(e->iconst), true);
      case Op::FloatConst: return llvm::ConstantFP::get(type(t), e->fconst);
      case Op::Var: {
        auto* s = vars_[e->id];
        if (!s) throw InternalError("kernel IR: use of undeclared variable v" + std::to_string(e->id));
        return b_.CreateLoad(var_types_[e->id], s);
      }
      case Op::Param: return param(e->id);
      case Op::Load: {
        Type storage = k_.buffers[e->id].type;
        auto* ptr = b_.CreateInBoundsGEP(type(storage), buffers_[e->id], arg(0));
        auto* raw = b_.CreateLoad(type(storage), ptr);
        in_access_group(raw);
        if (storage == Type::BF16) return bf16_to_f32(raw);
        if (storage == Type::F16) return b_.CreateFPExt(raw, b_.getFloatTy());
        return raw;
      }
      case Op::Neg: return is_float(t) ? b_.CreateFNeg(arg(0)) : b_.CreateNeg(arg(0));
      case Op::Abs:
        if (is_float(t)) return intrinsic(llvm::Intrinsic::fabs, arg(0));
        if (t == Type::U8) return arg(0);
        return b_.CreateCall(llvm::Intrinsic::getDeclaration(&m_, llvm::Intrinsic::abs, {type(t)}), {arg(0), b_.getFalse()});
      case Op::Exp: return intrinsic(llvm::Intrinsic::exp, arg(0));
      case Op::Log: return intrinsic(llvm::Intrinsic::log, arg(0));
      case Op::Sqrt: return intrinsic(llvm::Intrinsic::sqrt, arg(0));
      case Op::Tanh: return intrinsic(llvm::Intrinsic::tanh, arg(0));
      case Op::Cos: return intrinsic(llvm::Intrinsic::cos, arg(0));
      case Op::Sin: return intrinsic(llvm::Intrinsic::sin, arg(0));
      case Op::Floor: return intrinsic(llvm::Intrinsic::floor, arg(0));
      case Op::Bitcast: return b_.CreateBitCast(arg(0), type(t));
      case Op::Shl: return b_.CreateShl(arg(0), arg(1));
      case Op::AShr: return b_.CreateAShr(arg(0), arg(1));
      case Op::BitAnd: return b_.CreateAnd(arg(0), arg(1));
      case Op::BitOr: return b_.CreateOr(arg(0), arg(1));
      case Op::BitXor: return b_.CreateXor(arg(0), arg(1));
      case Op::Pow: return intrinsic(llvm::Intrinsic::pow, arg(0), arg(1));
      case Op::Add: return is_float(t) ? b_.CreateFAdd(arg(0), arg(1)) : b_.CreateAdd(arg(0), arg(1));
      case Op::Sub: return is_float(t) ? b_.CreateFSub(arg(0), arg(1)) : b_.CreateSub(arg(0), arg(1));
      case Op::Mul: return is_float(t) ? b_.CreateFMul(arg(0), arg(1)) : b_.CreateMul(arg(0), arg(1));
      case Op::MulWide: return b_.CreateMul(b_.CreateZExt(arg(0), b_.getInt64Ty()), b_.CreateZExt(arg(1), b_.getInt64Ty()));
      case Op::Div:
        if (is_float(t)) return b_.CreateFDiv(arg(0), arg(1));
        return t == Type::U8 ? b_.CreateUDiv(arg(0), arg(1)) : b_.CreateSDiv(arg(0), arg(1));
      case Op::Rem: return t == Type::U8 ? b_.CreateURem(arg(0), arg(1)) : b_.CreateSRem(arg(0), arg(1));
      case Op::Max:
        if (is_float(t)) return intrinsic(llvm::Intrinsic::maximum, arg(0), arg(1));  // NaN propagates (numpy)
        return intrinsic(t == Type::U8 ? llvm::Intrinsic::umax : llvm::Intrinsic::smax, arg(0), arg(1));
      case Op::Min:
        if (is_float(t)) return intrinsic(llvm::Intrinsic::minimum, arg(0), arg(1));
        return intrinsic(t == Type::U8 ? llvm::Intrinsic::umin : llvm::Intrinsic::smin, arg(0), arg(1));
      case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: {
        Type at = e->args[0]->type;
        llvm::Value *a = arg(0), *b = arg(1);
        if (is_float(at)) {
          switch (e->op) {
            case Op::Eq: return b_.CreateFCmpOEQ(a, b);
            case Op::Ne: return b_.CreateFCmpUNE(a, b);
            case Op::Lt: return b_.CreateFCmpOLT(a, b);
            default: return b_.CreateFCmpOLE(a, b);
          }
        }
        const bool u = at == Type::U8 || at == Type::I1;
        switch (e->op) {
          case Op::Eq: return b_.CreateICmpEQ(a, b);
          case Op::Ne: return b_.CreateICmpNE(a, b);
          case Op::Lt: return u ? b_.CreateICmpULT(a, b) : b_.CreateICmpSLT(a, b);
          default: return u ? b_.CreateICmpULE(a, b) : b_.CreateICmpSLE(a, b);
        }
      }
      case Op::And: return b_.CreateAnd(arg(0), arg(1));
      case Op::Or: return b_.CreateOr(arg(0), arg(1));
      case Op::Select: return b_.CreateSelect(arg(0), arg(1), arg(2));
      case Op::Cast: return cast(arg(0), e->args[0]->type, t);
    }
    throw InternalError("llvm renderer: bad op");
  }

  void stmt(const StmtPtr& s) {
    switch (s->kind) {
      case Stmt::Kind::Block:
        for (const auto& child : s->body) stmt(child);
        return;
      case Stmt::Kind::Store: {
        new_statement();
        Type storage = k_.buffers[s->buffer].type;
        llvm::Value* v = expr(s->b);
        if (storage == Type::BF16) v = bf16_bits(v);
        else if (storage == Type::F16) v = b_.CreateFPTrunc(v, b_.getHalfTy());  // exact: the value is an f16's
        else v = cast(v, s->b->type, storage);
        auto* ptr = b_.CreateInBoundsGEP(type(storage), buffers_[s->buffer], expr(s->a));
        in_access_group(b_.CreateStore(v, ptr));
        return;
      }
      case Stmt::Kind::Declare: {
        new_statement();
        llvm::Value* v = expr(s->a);
        b_.CreateStore(v, slot(s->var, type(s->type)));
        return;
      }
      case Stmt::Kind::Assign: {
        new_statement();
        llvm::Value* v = expr(s->a);
        b_.CreateStore(v, vars_[s->var]);
        return;
      }
      case Stmt::Kind::For: {
        new_statement();
        if (s->loop == LoopKind::GpuThread) throw InternalError("llvm renderer: a GPU loop in a CPU kernel");
        // The range loop (parallel or ordered) runs over the sub-range the caller passes.
        llvm::Value* lo = s->is_range_loop() ? begin_ : expr(s->a);
        llvm::Value* hi = s->is_range_loop() ? end_ : expr(s->b);
        auto* i = slot(s->var, b_.getInt64Ty());
        b_.CreateStore(lo, i);
        auto* header = llvm::BasicBlock::Create(ctx_, "loop", fn_);
        auto* body = llvm::BasicBlock::Create(ctx_, "body", fn_);
        auto* exit = llvm::BasicBlock::Create(ctx_, "exit", fn_);
        b_.CreateBr(header);
        b_.SetInsertPoint(header);
        auto* iv = b_.CreateLoad(b_.getInt64Ty(), i);
        b_.CreateCondBr(b_.CreateICmpSLT(iv, hi), body, exit);
        b_.SetInsertPoint(body);
        // A parallel range loop's iterations are independent (the executor splits them over
        // cores): its buffer accesses form an access group the loop declares parallel, so LLVM
        // vectorizes it without checking at run time that outputs a run may write over their
        // inputs (Buffer::may_alias) do not overlap the other buffers. With more such pairs
        // than its check limit it kept the loop scalar: an Adam update of several parameters
        // in one kernel, its outputs written over its inputs.
        // The same for the inner loops over an output's axes (Stmt::independent), each with a
        // group of its own: an access inside several such loops belongs to every one's group.
        // (Not where the loop reads a buffer it writes: a kernel that accumulates into its
        // output runs its loops in order, whatever they are marked.)
        const bool parallel = (s->loop == LoopKind::Parallel || s->independent) && !reads_what_it_writes(*s);
        if (parallel) access_groups_.push_back(llvm::MDNode::getDistinct(ctx_, {}));
        for (const auto& child : s->body) stmt(child);
        new_statement();
        auto* next = b_.CreateAdd(b_.CreateLoad(b_.getInt64Ty(), i), b_.getInt64(1));
        b_.CreateStore(next, i);
        llvm::BranchInst* back_edge = b_.CreateBr(header);
        if (parallel) {
          back_edge->setMetadata(llvm::LLVMContext::MD_loop, parallel_loop_id(access_groups_.back()));
          access_groups_.pop_back();
        }
        b_.SetInsertPoint(exit);
        new_statement();
        return;
      }
    }
  }

  // Values are reused only within a statement: blocks differ between statements.
  void new_statement() { cse_.clear(); }

  void in_access_group(llvm::Instruction* access) const {
    if (access_groups_.empty()) return;
    llvm::MDNode* groups = access_groups_.size() == 1
                               ? access_groups_.front()
                               : llvm::MDNode::get(ctx_, std::vector<llvm::Metadata*>(access_groups_.begin(), access_groups_.end()));
    access->setMetadata(llvm::LLVMContext::MD_access_group, groups);
  }

  // Whether a statement loads from a buffer it stores to.
  static bool reads_what_it_writes(const Stmt& s) {
    std::set<int> stored, loaded;
    std::set<const ExprNode*> seen;
    std::function<void(const Expr&)> loads = [&](const Expr& e) {
      if (!e || !seen.insert(e.get()).second) return;
      if (e->op == Op::Load) loaded.insert(e->id);
      for (const Expr& arg : e->args) loads(arg);
    };
    std::function<void(const Stmt&)> visit = [&](const Stmt& st) {
      if (st.kind == Stmt::Kind::Store) stored.insert(st.buffer);
      loads(st.a), loads(st.b);
      for (const StmtPtr& child : st.body) visit(*child);
    };
    visit(s);
    for (int b : stored)
      if (loaded.count(b)) return true;
    return false;
  }

  // A loop ID (distinct, its first operand itself) saying the loop's iterations are independent
  // for the accesses of `group`.
  llvm::MDNode* parallel_loop_id(llvm::MDNode* group) {
    llvm::Metadata* parallel[] = {llvm::MDString::get(ctx_, "llvm.loop.parallel_accesses"), group};
    llvm::TempMDNode self = llvm::MDNode::getTemporary(ctx_, {});
    llvm::Metadata* operands[] = {self.get(), llvm::MDNode::get(ctx_, parallel)};
    llvm::MDNode* id = llvm::MDNode::getDistinct(ctx_, operands);
    id->replaceOperandWith(0, id);
    return id;
  }

  const Kernel& k_;
  llvm::Function* fn_;
  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  std::vector<llvm::Value*> buffers_;
  llvm::Value *params_ = nullptr, *begin_ = nullptr, *end_ = nullptr;
  std::vector<llvm::AllocaInst*> vars_;
  std::vector<llvm::Type*> var_types_;
  std::map<int, llvm::Value*> params_cache_;
  std::map<const ExprNode*, llvm::Value*> cse_;
  std::vector<llvm::MDNode*> access_groups_;  // the parallel loops around the statement: their access groups
};

}  // namespace

std::unique_ptr<llvm::Module> render_llvm(const std::vector<kir::Kernel>& kernels, const std::vector<std::string>& names,
                                          llvm::LLVMContext& context, const llvm::TargetMachine& target) {
  auto module = std::make_unique<llvm::Module>("tessera", context);
  module->setTargetTriple(target.getTargetTriple().str());
  module->setDataLayout(target.createDataLayout());
  const std::string cpu = target.getTargetCPU().str(), features = target.getTargetFeatureString().str();
  const bool avx512 = features.find("+avx512f") != std::string::npos;
  auto* ptr = llvm::PointerType::get(context, 0);
  auto* i64 = llvm::Type::getInt64Ty(context);
  for (size_t k = 0; k < kernels.size(); ++k) {
    const kir::Kernel& kernel = kernels[k];
    // The body takes each buffer as a noalias pointer (kernels never read what they write), but
    // for an output a run may write over an input, and that input (Buffer::may_alias); the ABI
    // entry loads them from the array and calls it (inlined by the optimiser).
    std::vector<llvm::Type*> body_args(kernel.buffers.size(), ptr);
    body_args.insert(body_args.end(), {ptr, i64, i64});
    auto* body_type = llvm::FunctionType::get(llvm::Type::getVoidTy(context), body_args, false);
    auto* body = llvm::Function::Create(body_type, llvm::Function::InternalLinkage, names[k] + "_body", module.get());
    for (size_t b = 0; b < kernel.buffers.size(); ++b)
      if (!kernel.buffers[b].may_alias) body->addParamAttr(unsigned(b), llvm::Attribute::NoAlias);
    for (llvm::Function* f : {body}) {
      f->addFnAttr("target-cpu", cpu);
      f->addFnAttr("target-features", features);
      if (avx512) f->addFnAttr("prefer-vector-width", "512");
      f->addFnAttr(llvm::Attribute::NoUnwind);
      f->addFnAttr(llvm::Attribute::AlwaysInline);
    }
    FunctionRenderer(kernel, body, *module).render();

    auto* entry_type = llvm::FunctionType::get(llvm::Type::getVoidTy(context), {ptr, ptr, i64, i64}, false);
    auto* entry = llvm::Function::Create(entry_type, llvm::Function::ExternalLinkage, names[k], module.get());
    entry->addFnAttr("target-cpu", cpu);
    entry->addFnAttr("target-features", features);
    entry->addFnAttr(llvm::Attribute::NoUnwind);
    llvm::IRBuilder<> b(llvm::BasicBlock::Create(context, "entry", entry));
    std::vector<llvm::Value*> call_args;
    auto arg = entry->arg_begin();
    llvm::Value* buffers = &*arg++;
    for (size_t i = 0; i < kernel.buffers.size(); ++i)
      call_args.push_back(b.CreateLoad(ptr, b.CreateConstInBoundsGEP1_64(ptr, buffers, i)));
    for (; arg != entry->arg_end(); ++arg) call_args.push_back(&*arg);
    b.CreateCall(body, call_args);
    b.CreateRetVoid();
  }
  std::string errors;
  llvm::raw_string_ostream os(errors);
  if (llvm::verifyModule(*module, &os)) throw InternalError("generated LLVM IR is invalid: " + os.str());
  return module;
}

}  // namespace tessera
