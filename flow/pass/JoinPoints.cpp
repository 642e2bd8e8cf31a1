//===- JoinPoints.cpp - the join-point table and its sleds (bunkai-flow-jp) --===//
//
// KLASY's "extended symbol table" (seed 003, §3.1), for user-space C:
//
//   access   every load, store (atomics count as stores) and call argument
//            ("addr": &p->member handed to a function or memcpy) whose
//            address is a GEP into a named struct with a constant member
//            index. The join point is the innermost struct of the GEP
//            (`o->in.x` is an access to in.x) and $base is that struct
//            instance's address: the pointer operand when the GEP starts at
//            the instance, else a prefix of the GEP materialised before the
//            sled (`p[i].x`: &p[i], one lea). Byte-offset GEPs (i8) that
//            optimisations sometimes leave are not recognised.
//   entry    every defined function with debug info, after its allocas:
//            $arg0..$argN are the IR arguments.
//   exit     with -bunkai-flow-after, the same functions' returns: a sled
//            right before each `ret` (not after a musttail call, which
//            must stay last), $retval the value returned.
//
// Each join point also names the C variables visible there (Variables.h)
// and where each lives. The function, file and line are the source's: an
// access inlined from f into g is an access in f, at f's line (f's entry
// join point exists only in f's out-of-line copy, if one is left).
//
// It runs at OptimizerLastEP: the sleds are inline asm with side effects,
// which no IR optimisation may move, merge or delete, so inserting them
// earlier would block the very optimisations whose output is being
// profiled. The price is that an access the optimiser removed (a load
// forwarded from a store, a loop-invariant load hoisted and merged) has no
// join point: the table describes the program that runs.
//
// Full debug info (-g) is required: member names exist only there. A
// module without it is an error, not a silent empty table.
//===----------------------------------------------------------------------===//
#include "Passes.h"
#include "Sled.h"
#include "StructNames.h"
#include "Variables.h"

#include "../include/bunkai_flow.h"

#include "llvm/IR/Constants.h"
#include "llvm/IR/DebugInfoMetadata.h"
#include "llvm/IR/Dominators.h"
#include "llvm/IR/InstIterator.h"
#include "llvm/IR/Instructions.h"
#include "llvm/IR/IntrinsicInst.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/Operator.h"
#include "llvm/Support/raw_ostream.h"

using namespace llvm;

namespace bunkai::flow {

namespace {

// A return that must stay right after a musttail call (with at most
// bitcasts of its value between them): no sled may go in between.
bool afterMustTail(const ReturnInst *Ret) {
  const Instruction *P = Ret->getPrevNode();
  while (P && isa<BitCastInst>(P))
    P = P->getPrevNode();
  auto *CI = dyn_cast_or_null<CallInst>(P);
  return CI && CI->isMustTailCall();
}

// One join point found, before anything is inserted.
struct Site {
  Instruction *At;          // the sled goes right before it (after: right after it)
  Record R;
  bool After = false;       // BKF_KIND_AFTER: the sled follows At
  // access: the GEP and how many of its indices address the struct
  GEPOperator *GEP = nullptr;
  unsigned Prefix = 0;
  std::vector<Variable> Vars;
};

// The struct member a pointer addresses: the innermost struct level of a
// GEP, looking through pointer casts (a union member or char array is
// reached through a bitcast of the member's address).
struct Member {
  GEPOperator *GEP = nullptr;
  StructType *ST = nullptr;
  unsigned Field = 0;
  unsigned Prefix = 0; // indices [0, Prefix) give the struct's address
};

Member memberOf(Value *Ptr) {
  while (auto *Op = dyn_cast<Operator>(Ptr)) {
    if (Op->getOpcode() != Instruction::BitCast &&
        Op->getOpcode() != Instruction::AddrSpaceCast)
      break;
    Ptr = Op->getOperand(0);
  }
  Member M;
  auto *G = dyn_cast<GEPOperator>(Ptr);
  if (!G || G->getNumIndices() < 2)
    return M;
  Type *T = G->getSourceElementType();
  unsigned K = 1;
  for (auto It = G->idx_begin() + 1; It != G->idx_end(); ++It, ++K) {
    if (auto *ST = dyn_cast<StructType>(T)) {
      auto *C = dyn_cast<ConstantInt>(*It);
      if (!C)
        return Member{};
      M.ST = ST;
      M.Field = C->getZExtValue();
      M.Prefix = K;
      T = ST->getElementType(M.Field);
    } else if (auto *AT = dyn_cast<ArrayType>(T)) {
      T = AT->getElementType();
    } else {
      break;
    }
  }
  if (M.ST)
    M.GEP = G;
  return M;
}

// The address of the struct instance an access addresses.
Value *baseOf(GEPOperator *G, unsigned Prefix, Instruction *Before) {
  auto *First = dyn_cast<ConstantInt>(*G->idx_begin());
  if (Prefix == 1 && First && First->isZero())
    return G->getPointerOperand();
  SmallVector<Value *, 4> Idx(G->idx_begin(), G->idx_begin() + Prefix);
  if (auto *C = dyn_cast<Constant>(G->getPointerOperand())) {
    SmallVector<Constant *, 4> CIdx;
    bool AllConst = true;
    for (Value *V : Idx) {
      auto *CV = dyn_cast<Constant>(V);
      if (!CV)
        AllConst = false;
      CIdx.push_back(CV);
    }
    if (AllConst)
      return ConstantExpr::getGetElementPtr(G->getSourceElementType(), C, CIdx,
                                            G->isInBounds());
  }
  auto *GI = GetElementPtrInst::Create(G->getSourceElementType(),
                                       G->getPointerOperand(), Idx, "bkf.base",
                                       Before);
  GI->setIsInBounds(G->isInBounds());
  GI->setDebugLoc(Before->getDebugLoc());
  return GI;
}

// The access's source location. Optimisations that merge or hoist an
// instruction give it line 0 or none; the address computation often keeps
// the line the access was written on.
const DILocation *locationOf(Instruction &I, GEPOperator *G) {
  const DILocation *Own = I.getDebugLoc().get();
  const DILocation *Addr = nullptr;
  if (auto *GI = dyn_cast_or_null<Instruction>(G))
    Addr = GI->getDebugLoc().get();
  if (Own && Own->getLine())
    return Own;
  if (Addr && Addr->getLine())
    return Addr;
  return Own ? Own : Addr;
}

// Intrinsics that are not the program touching memory.
bool bookkeeping(const CallBase &CB) {
  if (CB.isInlineAsm())
    return false;
  auto *II = dyn_cast<IntrinsicInst>(&CB);
  return II && !isa<MemIntrinsic>(II);
}

} // namespace

PreservedAnalyses JoinPointsPass::run(Module &M, ModuleAnalysisManager &MAM) {
  // Already instrumented (the plugin loaded twice, or opt after clang).
  if (M.getModuleFlag("bunkai-flow-jp"))
    return PreservedAnalyses::all();
  if (!Opts.Error.empty()) {
    M.getContext().emitError("bunkai flow: " + Opts.Error);
    return PreservedAnalyses::all();
  }

  bool FullDebug = false;
  for (DICompileUnit *CU : M.debug_compile_units())
    if (CU->getEmissionKind() == DICompileUnit::FullDebug)
      FullDebug = true;
  if (!FullDebug) {
    M.getContext().emitError(
        "bunkai flow: " + M.getSourceFileName() +
        " has no full debug info: join points take struct member and "
        "variable names from it (compile with -g; `bunkai flow cc` adds it)");
    return PreservedAnalyses::all();
  }

  StructNames Names(M);
  auto &FAM = MAM.getResult<FunctionAnalysisManagerModuleProxy>(M).getManager();
  unsigned Total = 0, Dropped = 0;

  auto skip = [&](const DILocation *L, const Twine &Why) {
    if (!Opts.Verbose)
      return;
    errs() << "bunkai flow: ";
    if (L)
      errs() << L->getFilename() << ":" << L->getLine() << ": ";
    errs() << "no join point: " << Why << "\n";
  };

  for (Function &F : M) {
    DISubprogram *SP = F.getSubprogram();
    if (F.isDeclaration() || !SP || F.hasAvailableExternallyLinkage() ||
        F.hasFnAttribute(Attribute::Naked))
      continue;
    std::vector<Site> Sites, Exits;
    DominatorTree &DT = FAM.getResult<DominatorTreeAnalysis>(F);
    Variables Vars(F, DT);

    if (Opts.Entry && Opts.wantFunction(SP->getName(), F.getName()) &&
        Opts.wantFile(SP->getFilename())) {
      Instruction *At = &*F.getEntryBlock().getFirstInsertionPt();
      while (isa<AllocaInst>(At) || isa<DbgInfoIntrinsic>(At))
        At = At->getNextNode();
      Site S{At, Record{BKF_KIND_ENTRY, "-", "-", SP->getName().str(),
                        SP->getFilename().str(), SP->getLine(), "entry"}};
      Sites.push_back(std::move(S));
      // <after> advice on the entry runs at the function's returns
      if (Opts.After)
        for (BasicBlock &B : F) {
          auto *Ret = dyn_cast<ReturnInst>(B.getTerminator());
          if (!Ret)
            continue;
          if (afterMustTail(Ret)) {
            skip(Ret->getDebugLoc().get(), "a return after a musttail call");
            continue;
          }
          // before the lifetime ends that close the function's scope, so
          // that a variable in memory is still alive where it is loaded
          Instruction *At = Ret;
          while (auto *II = dyn_cast_or_null<IntrinsicInst>(At->getPrevNode())) {
            if (II->getIntrinsicID() != Intrinsic::lifetime_end && !isa<DbgInfoIntrinsic>(II))
              break;
            At = II;
          }
          const DILocation *Loc = Ret->getDebugLoc().get();
          Site X{At, Record{BKF_KIND_EXIT, "-", "-", SP->getName().str(),
                             SP->getFilename().str(), Loc ? Loc->getLine() : SP->getLine(), "exit"}};
          if (Opts.Locals)
            X.Vars = Vars.at(At, Loc);
          Exits.push_back(std::move(X));
        }
    }

    for (Instruction &I : instructions(F)) {
      std::vector<std::pair<Value *, const char *>> Ptrs;
      if (auto *L = dyn_cast<LoadInst>(&I)) {
        if (Opts.Load)
          Ptrs.push_back({L->getPointerOperand(), "load"});
      } else if (auto *St = dyn_cast<StoreInst>(&I)) {
        if (Opts.Store)
          Ptrs.push_back({St->getPointerOperand(), "store"});
      } else if (auto *RMW = dyn_cast<AtomicRMWInst>(&I)) {
        if (Opts.Store)
          Ptrs.push_back({RMW->getPointerOperand(), "store"});
      } else if (auto *CX = dyn_cast<AtomicCmpXchgInst>(&I)) {
        if (Opts.Store)
          Ptrs.push_back({CX->getPointerOperand(), "store"});
      } else if (auto *CB = dyn_cast<CallBase>(&I)) {
        if (Opts.Addr && !bookkeeping(*CB))
          for (Value *A : CB->args())
            if (A->getType()->isPointerTy())
              Ptrs.push_back({A, "addr"});
      }
      for (auto [Ptr, Access] : Ptrs) {
        Member Mb = memberOf(Ptr);
        if (!Mb.ST)
          continue;
        const DILocation *Loc = locationOf(I, Mb.GEP);
        if (!Mb.ST->hasName() || !Mb.ST->getName().startswith("struct."))
          continue; // unions, literal structs
        std::string SName = Names.structName(Mb.ST);
        if (SName.empty()) {
          skip(Loc, "debug info has no C struct for %" + Mb.ST->getName());
          continue;
        }
        if (!Opts.wantStruct(SName))
          continue;
        std::string MName = Names.memberName(Mb.ST, Mb.Field);
        if (MName.empty()) {
          skip(Loc, "struct " + SName + " field " + Twine(Mb.Field) +
                        " is padding or an unnamed member");
          continue;
        }
        const DISubprogram *Src = Loc ? Loc->getScope()->getSubprogram() : SP;
        StringRef File = Loc ? Loc->getFilename() : SP->getFilename();
        if (!Opts.wantFunction(Src->getName(), F.getName()) ||
            !Opts.wantFile(File))
          continue;
        Site S{&I, Record{BKF_KIND_ACCESS, SName, MName, Src->getName().str(),
                          File.str(), Loc ? Loc->getLine() : 0, Access}};
        S.GEP = Mb.GEP;
        S.Prefix = Mb.Prefix;
        S.R.Bits = Names.memberBits(Mb.ST, Mb.Field);
        if (Opts.Locals)
          S.Vars = Vars.at(&I, Loc);
        // <after> advice: the same access's second sled, right after the
        // instruction (not after an invoke, which ends its block, nor after
        // a musttail call, which only its return may follow)
        auto *CI = dyn_cast<CallInst>(&I);
        bool After = Opts.After && !I.isTerminator() && !(CI && CI->isMustTailCall());
        Site A = S;
        Sites.push_back(std::move(S));
        if (After) {
          A.After = true;
          A.R.Kind = BKF_KIND_AFTER;
          Sites.push_back(std::move(A));
        }
      }
    }
    if (!Sites.empty() && Opts.Locals && Opts.Entry &&
        Sites.front().R.Kind == BKF_KIND_ENTRY)
      Sites.front().Vars = Vars.at(Sites.front().At, nullptr);
    for (Site &X : Exits)
      Sites.push_back(std::move(X));

    // A patched sled calls its trampoline, and the call pushes a return
    // address at -8(%rsp): in a leaf function's red zone that may be live
    // data. Functions with sleds therefore keep nothing below %rsp.
    if (!Sites.empty())
      F.addFnAttr(Attribute::NoRedZone);

    // Everything is found before anything is inserted: the variable
    // analysis reads the function as the optimiser left it.
    for (Site &S : Sites) {
      // An after sled goes before the instruction that follows the access
      // (the access's own before sled is already in place above it).
      Instruction *Pt = S.After ? S.At->getNextNode() : S.At;
      std::vector<Operand> Ops;
      if (S.R.Kind == BKF_KIND_ENTRY) {
        for (Argument &A : F.args())
          Ops.push_back({"$arg" + std::to_string(A.getArgNo()), &A});
      } else if (S.R.Kind == BKF_KIND_EXIT) {
        if (auto *Ret = cast<ReturnInst>(S.At->getParent()->getTerminator()); Value *V = Ret->getReturnValue())
          Ops.push_back({"$retval", V});
      } else {
        Ops.push_back({"$base", baseOf(S.GEP, S.Prefix, Pt)});
        if (S.After && isa<LoadInst>(S.At))
          Ops.push_back({"$value", S.At});
      }
      for (Variable &V : S.Vars) {
        Value *Val = V.V;
        if (V.InMemory) {
          auto *LI = new LoadInst(V.InMemory->getAllocatedType(), V.InMemory,
                                  V.Name + ".bkf", Pt);
          LI->setDebugLoc(S.At->getDebugLoc());
          Val = LI;
        }
        Ops.push_back({V.Name, Val});
      }
      Dropped += insertSled(Pt, S.R, Ops, Opts.MaxOperands);
      ++Total;
    }
  }

  M.addModuleFlag(Module::Max, "bunkai-flow-jp", 1);
  if (Opts.Verbose)
    errs() << "bunkai flow: " << M.getSourceFileName() << ": " << Total
           << " join points, " << Dropped << " operands left out\n";
  return Total ? PreservedAnalyses::none() : PreservedAnalyses::all();
}

} // namespace bunkai::flow
