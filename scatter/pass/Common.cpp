//===- Common.cpp - decision log and owner analysis for the scatter passes -===//
#include "Common.h"

#include "llvm/IR/GlobalAlias.h"
#include "llvm/IR/GlobalIFunc.h"

#include <functional>
#include <memory>

using namespace llvm;

static cl::opt<std::string>
    LogFile("bunkai-log", cl::desc("append scatter decisions to this file"),
            cl::init(""));

namespace bunkai {

raw_ostream &log() {
  static std::unique_ptr<raw_fd_ostream> OS;
  if (LogFile.empty())
    return nulls();
  if (!OS) {
    std::error_code EC;
    OS = std::make_unique<raw_fd_ostream>(LogFile, EC, sys::fs::OF_Append);
    if (EC)
      report_fatal_error(Twine("bunkai: cannot open ") + std::string(LogFile) + ": " +
                         EC.message());
  }
  return *OS;
}

std::set<const GlobalValue *> usedSet(const Module &M) {
  std::set<const GlobalValue *> Out;
  for (const char *Name : {"llvm.used", "llvm.compiler.used"}) {
    const GlobalVariable *GV = M.getNamedGlobal(Name);
    if (!GV || !GV->hasInitializer())
      continue;
    const auto *Arr = dyn_cast<ConstantArray>(GV->getInitializer());
    if (!Arr)
      continue;
    for (const Use &Op : Arr->operands())
      if (const auto *G =
              dyn_cast<GlobalValue>(Op.get()->stripPointerCasts()))
        Out.insert(G);
  }
  return Out;
}

std::string Owners::pinnedReason(const GlobalVariable &GV) const {
  if (GV.isDeclaration())
    return "declaration";
  if (GV.getName().startswith("llvm."))
    return "llvm intrinsic global";
  if (isPublic(GV))
    return "public symbol";
  if (Used.count(&GV))
    return "marked used";
  if (GV.hasSection())
    return "explicit section";
  if (GV.isExternallyInitialized())
    return "externally initialized";
  return "";
}

namespace {

// Direct users of V, looking through constant expressions: functions
// (extracted, or Launcher) and global variables whose initialiser holds V.
void directUsers(const Value *V, std::set<const Function *> &Fns,
                 std::set<const GlobalVariable *> &Vars, unsigned Depth = 0) {
  for (const User *U : V->users()) {
    if (const auto *I = dyn_cast<Instruction>(U)) {
      const Function *F = I->getFunction();
      Fns.insert(hasId(*F) ? F : Owners::Launcher);
    } else if (const auto *G = dyn_cast<GlobalVariable>(U)) {
      Vars.insert(G);
    } else if (isa<Constant>(U) && !isa<GlobalValue>(U) && Depth < 64) {
      directUsers(U, Fns, Vars, Depth + 1);
    } else {
      // Aliases, ifuncs, block addresses, metadata-as-value: all launcher.
      Fns.insert(Owners::Launcher);
    }
  }
}

} // namespace

Owners::Owners(const Module &M) : Used(usedSet(M)) {
  // Graph: an edge H -> G when H's initialiser (H a variable) refers to G.
  std::vector<const GlobalVariable *> Vars;
  DenseMap<const GlobalVariable *, unsigned> Index;
  for (const GlobalVariable &GV : M.globals()) {
    Index[&GV] = Vars.size();
    Vars.push_back(&GV);
  }
  size_t N = Vars.size();
  std::vector<std::set<const Function *>> Fns(N);
  std::vector<std::vector<unsigned>> UsersOf(N); // G -> the H that hold G
  for (size_t I = 0; I < N; ++I) {
    std::set<const GlobalVariable *> Holders;
    directUsers(Vars[I], Fns[I], Holders);
    for (const GlobalVariable *H : Holders)
      UsersOf[I].push_back(Index[H]);
  }

  // Relative references (sub(ptrtoint G, ptrtoint H): -O2's relative lookup
  // tables) need G and H in the same object, since a PC-relative relocation
  // cannot name a symbol of another one: tie them both ways, so they land
  // in one component and move or stay together.
  std::function<void(const Constant *, unsigned, bool,
                     SmallPtrSetImpl<const Constant *> &)>
      Rel = [&](const Constant *C, unsigned H, bool InSub,
                SmallPtrSetImpl<const Constant *> &Seen) {
        if (const auto *G = dyn_cast<GlobalVariable>(C)) {
          auto It = Index.find(G);
          if (InSub && It != Index.end() && It->second != H)
            UsersOf[H].push_back(It->second);
          return;
        }
        if (isa<GlobalValue>(C) || !Seen.insert(C).second)
          return;
        const auto *CE = dyn_cast<ConstantExpr>(C);
        bool Sub = InSub || (CE && CE->getOpcode() == Instruction::Sub);
        for (const Use &Op : C->operands())
          if (const auto *OC = dyn_cast<Constant>(Op.get()))
            Rel(OC, H, Sub, Seen);
      };
  for (size_t I = 0; I < N; ++I)
    if (Vars[I]->hasInitializer()) {
      SmallPtrSet<const Constant *, 16> Seen;
      Rel(Vars[I]->getInitializer(), I, false, Seen);
    }

  // Tarjan over edges G -> H (G is used by H), iteratively. It emits a
  // component only after every component it reaches, i.e. users first when
  // read in reverse; we want users solved first, so we walk G -> holders
  // and then process the emitted order reversed.
  std::vector<int> Low(N, -1), Num(N, -1);
  std::vector<bool> OnStack(N, false);
  std::vector<unsigned> Stack, Order; // Order: components as emitted
  std::vector<unsigned> CompOf(N, ~0u);
  unsigned Counter = 0, NComp = 0;
  for (size_t Root = 0; Root < N; ++Root) {
    if (Num[Root] != -1)
      continue;
    std::vector<std::pair<unsigned, size_t>> Work{{(unsigned)Root, 0}};
    while (!Work.empty()) {
      auto &[V, Edge] = Work.back();
      if (Edge == 0 && Num[V] == -1) {
        Num[V] = Low[V] = Counter++;
        Stack.push_back(V);
        OnStack[V] = true;
      }
      if (Edge < UsersOf[V].size()) {
        unsigned W = UsersOf[V][Edge++];
        if (Num[W] == -1) {
          Work.push_back({W, 0});
        } else if (OnStack[W]) {
          Low[V] = std::min(Low[V], Num[W]);
        }
        continue;
      }
      if (Low[V] == Num[V]) {
        while (true) {
          unsigned W = Stack.back();
          Stack.pop_back();
          OnStack[W] = false;
          CompOf[W] = NComp;
          if (W == V)
            break;
        }
        Order.push_back(NComp++);
      }
      unsigned Done = V;
      Work.pop_back();
      if (!Work.empty())
        Low[Work.back().first] = std::min(Low[Work.back().first], Low[Done]);
    }
  }
  // Emission order is "holders before the held" reversed: a component is
  // emitted after all components reachable from it, and reachable means
  // "its holders". So holders are emitted first: solve in emission order.
  std::vector<std::vector<unsigned>> Members(NComp);
  for (size_t I = 0; I < N; ++I)
    Members[CompOf[I]].push_back(I);
  CompOwners.assign(NComp, {});
  CompPinned.assign(NComp, false);
  for (unsigned C : Order) {
    auto &Own = CompOwners[C];
    for (unsigned I : Members[C]) {
      Own.insert(Fns[I].begin(), Fns[I].end());
      if (!pinnedReason(*Vars[I]).empty())
        CompPinned[C] = true;
      for (unsigned H : UsersOf[I]) {
        unsigned HC = CompOf[H];
        if (HC == C)
          continue; // a reference inside the component
        const auto &HO = CompOwners[HC];
        bool HMoves = !CompPinned[HC] && HO.size() == 1 &&
                      *HO.begin() != Launcher;
        Own.insert(HMoves ? *HO.begin() : Launcher);
      }
    }
  }
  for (size_t I = 0; I < N; ++I)
    Comp[Vars[I]] = CompOf[I];
}

const std::set<const Function *> &Owners::of(const GlobalVariable &GV) {
  static const std::set<const Function *> None;
  auto It = Comp.find(&GV);
  return It == Comp.end() ? None : CompOwners[It->second];
}

const Function *Owners::soleOwner(const GlobalVariable &GV) {
  auto It = Comp.find(&GV);
  if (It == Comp.end() || CompPinned[It->second])
    return nullptr;
  const auto &O = CompOwners[It->second];
  if (O.size() == 1 && *O.begin() != Launcher)
    return *O.begin();
  return nullptr;
}

} // namespace bunkai
