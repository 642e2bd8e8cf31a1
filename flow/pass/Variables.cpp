//===- Variables.cpp - the named C variables visible at a join point --------===//
#include "Variables.h"

#include "llvm/ADT/PostOrderIterator.h"
#include "llvm/IR/CFG.h"
#include "llvm/IR/InstIterator.h"
#include "llvm/IR/IntrinsicInst.h"

#include <algorithm>
#include <set>

using namespace llvm;

namespace bunkai::flow {

// Scalars a sled can take in one register.
static bool scalarType(Type *T) {
  if (T->isPointerTy() || T->isFloatTy() || T->isDoubleTy())
    return true;
  if (auto *IT = dyn_cast<IntegerType>(T))
    return IT->getBitWidth() == 8 || IT->getBitWidth() == 16 ||
           IT->getBitWidth() == 32 || IT->getBitWidth() == 64;
  return false;
}

Variables::Variables(Function &F, DominatorTree &DT) : F(F), DT(DT) {
  for (Instruction &I : instructions(F)) {
    auto *DD = dyn_cast<DbgDeclareInst>(&I);
    if (!DD || DD->getExpression()->getNumElements() != 0)
      continue;
    auto *AI = dyn_cast_or_null<AllocaInst>(DD->getAddress());
    if (!AI || AI->isArrayAllocation() || !scalarType(AI->getAllocatedType()))
      continue;
    Declared[{DD->getVariable(), DD->getDebugLoc().getInlinedAt()}] = AI;
  }
}

void Variables::transfer(const Instruction &I, State &S) {
  const auto *DV = dyn_cast<DbgValueInst>(&I);
  if (!DV)
    return;
  Key K{DV->getVariable(), DV->getDebugLoc().getInlinedAt()};
  // Only a plain "the variable is this value": no fragment, no arithmetic,
  // no list of locations. Anything else makes the variable unknown.
  // (A value deleted under a dbg.value leaves an empty metadata node:
  // no value at all.)
  Value *V = DV->hasArgList() ? nullptr : DV->getValue(0);
  if (!V || DV->isUndef() || DV->getExpression()->getNumElements() != 0) {
    S.erase(K);
    return;
  }
  S[K] = V;
}

void Variables::solve() {
  Solved = true;
  ReversePostOrderTraversal<Function *> RPO(&F);
  DenseMap<const BasicBlock *, State> Out;
  bool Changed = true;
  while (Changed) {
    Changed = false;
    for (BasicBlock *BB : RPO) {
      State S;
      bool First = true;
      if (BB != &F.getEntryBlock()) {
        for (BasicBlock *P : predecessors(BB)) {
          auto It = Out.find(P);
          if (It == Out.end())
            continue; // not reached yet: optimistic
          if (First) {
            S = It->second;
            First = false;
            continue;
          }
          for (auto SI = S.begin(); SI != S.end();) {
            auto PI = It->second.find(SI->first);
            if (PI == It->second.end() || PI->second != SI->second)
              SI = S.erase(SI);
            else
              ++SI;
          }
        }
      }
      In[BB] = S;
      for (const Instruction &I : *BB)
        transfer(I, S);
      auto OI = Out.find(BB);
      if (OI == Out.end() || OI->second != S) {
        Out[BB] = std::move(S);
        Changed = true;
      }
    }
  }
}

// The scopes enclosing Scope, innermost first.
static std::vector<const DILocalScope *> chain(const DILocalScope *Scope) {
  std::vector<const DILocalScope *> Out;
  while (Scope) {
    Out.push_back(Scope);
    if (isa<DISubprogram>(Scope))
      break;
    auto *LB = dyn_cast<DILexicalBlockBase>(Scope);
    if (!LB)
      break;
    Scope = LB->getScope();
  }
  return Out;
}

std::vector<Variable> Variables::at(Instruction *I, const DILocation *Loc) {
  if (!Solved)
    solve();
  const DILocalScope *Scope = Loc ? Loc->getScope() : F.getSubprogram();
  const DILocation *InlinedAt = Loc ? Loc->getInlinedAt() : nullptr;
  if (!Scope)
    return {};
  std::vector<const DILocalScope *> Scopes = chain(Scope);
  auto depth = [&](const DILocalVariable *V) -> int {
    auto It = std::find(Scopes.begin(), Scopes.end(), V->getScope());
    return It == Scopes.end() ? -1 : int(It - Scopes.begin());
  };

  State S = In.lookup(I->getParent());
  for (Instruction &J : *I->getParent()) {
    if (&J == I)
      break;
    transfer(J, S);
  }

  struct Cand {
    const DILocalVariable *Var;
    int Depth;
    Variable V;
  };
  std::map<std::string, Cand> ByName; // shadowing: innermost wins
  auto offer = [&](const DILocalVariable *Var, Variable V) {
    StringRef Name = Var->getName();
    if (Name.empty() || Name.startswith("$"))
      return;
    int D = depth(Var);
    if (D < 0)
      return;
    auto It = ByName.find(Name.str());
    if (It != ByName.end() && It->second.Depth <= D)
      return;
    V.Name = Name.str();
    ByName[Name.str()] = Cand{Var, D, V};
  };
  for (auto &[K, Val] : S) {
    if (K.second != InlinedAt)
      continue;
    if (auto *Def = dyn_cast<Instruction>(Val))
      if (!DT.dominates(Def, I))
        continue;
    if (isa<UndefValue>(Val))
      continue;
    offer(K.first, Variable{"", Val, nullptr});
  }
  for (auto &[K, AI] : Declared) {
    if (K.second != InlinedAt || S.count(K))
      continue;
    bool Stored = false;
    for (User *U : AI->users())
      if (auto *St = dyn_cast<StoreInst>(U))
        if (St->getPointerOperand() == AI && DT.dominates(St, I)) {
          Stored = true;
          break;
        }
    if (Stored)
      offer(K.first, Variable{"", nullptr, AI});
  }

  std::vector<Cand> Sorted;
  for (auto &[N, C] : ByName)
    Sorted.push_back(C);
  std::stable_sort(Sorted.begin(), Sorted.end(),
                   [](const Cand &A, const Cand &B) {
                     unsigned AA = A.Var->getArg(), BA = B.Var->getArg();
                     if ((AA != 0) != (BA != 0))
                       return AA != 0;
                     if (AA != BA)
                       return AA < BA;
                     if (A.Var->getLine() != B.Var->getLine())
                       return A.Var->getLine() < B.Var->getLine();
                     return A.V.Name < B.V.Name;
                   });
  std::vector<Variable> Out;
  for (Cand &C : Sorted)
    Out.push_back(C.V);
  return Out;
}

} // namespace bunkai::flow
