//===- MergeStatics.cpp - expose shared non-public data by index & offset --===//
//
// §3.2/§4.4: a static variable (or string literal) used by several extracted
// functions must stay in the launcher, yet the libraries must reach it.
// Exporting each one would grow the launcher's dynamic symbol table by one
// entry per variable, so they are merged into one exported struct and every
// use becomes a constant GEP: symbol + field index (= offset).
//
// Three structs, so that merging changes no section: __bunkai_rodata
// (constants), __bunkai_bss (zero-initialised, costs no file bytes) and
// __bunkai_data (the rest). Fields are laid out by hand in a packed struct
// with explicit padding, so each variable keeps its own alignment.
//
// Not merged, but renamed __bunkai_g<hex> and exported: thread-local
// variables (a struct cannot be partly thread-local) and variables pinned to
// a section or named by assembly. Variables with a single owner are left
// alone here; bunkai-split moves them into that function's library (§3.1).
//===----------------------------------------------------------------------===//
#include "Common.h"
#include "Passes.h"

#include "llvm/IR/Constants.h"
#include "llvm/IR/DataLayout.h"
#include "llvm/IR/DerivedTypes.h"
#include "llvm/IR/Module.h"

#include <vector>

using namespace llvm;

namespace bunkai {

namespace {

struct Bucket {
  const char *Name;
  bool Constant;
  std::vector<GlobalVariable *> Vars;
};

void mergeBucket(Module &M, Bucket &B) {
  if (B.Vars.empty())
    return;
  const DataLayout &DL = M.getDataLayout();
  LLVMContext &Ctx = M.getContext();
  std::vector<Type *> Fields;
  std::vector<unsigned> FieldOf; // per var
  std::vector<uint64_t> OffsetOf;
  uint64_t Offset = 0;
  Align MaxAlign(1);
  for (GlobalVariable *GV : B.Vars) {
    Type *T = GV->getValueType();
    Align A = DL.getPreferredAlign(GV);
    if (A > MaxAlign)
      MaxAlign = A;
    uint64_t At = alignTo(Offset, A);
    if (At > Offset)
      Fields.push_back(ArrayType::get(Type::getInt8Ty(Ctx), At - Offset));
    FieldOf.push_back(Fields.size());
    OffsetOf.push_back(At);
    Fields.push_back(T);
    Offset = At + DL.getTypeAllocSize(T);
  }
  StructType *STy =
      StructType::create(Ctx, Fields, std::string("bunkai.") + B.Name,
                         /*isPacked=*/true);
  auto *S = new GlobalVariable(M, STy, B.Constant, GlobalValue::ExternalLinkage,
                               nullptr, B.Name);
  S->setAlignment(MaxAlign);
  // Protected: exported to the libraries, yet not preemptible, so the
  // launcher's own PC-relative references to it stay valid in a
  // shared-library launcher too.
  S->setVisibility(GlobalValue::ProtectedVisibility);
  S->setDSOLocal(true);

  Type *I32 = Type::getInt32Ty(Ctx);
  for (size_t I = 0; I < B.Vars.size(); ++I) {
    GlobalVariable *GV = B.Vars[I];
    log() << "merge\t" << GV->getName() << "\t" << B.Name << "\t"
          << OffsetOf[I] << "\n";
    Constant *Idx[] = {ConstantInt::get(I32, 0),
                       ConstantInt::get(I32, FieldOf[I])};
    Constant *GEP = ConstantExpr::getInBoundsGetElementPtr(STy, S, Idx);
    if (GEP->getType() != GV->getType())
      GEP = ConstantExpr::getPointerCast(GEP, GV->getType());
    GV->replaceAllUsesWith(GEP);
  }
  // Initialisers are read after every replacement, so a merged variable
  // that points at another merged variable now points into the struct.
  std::vector<Constant *> Inits;
  size_t V = 0;
  for (size_t FI = 0; FI < Fields.size(); ++FI) {
    if (V < B.Vars.size() && FieldOf[V] == FI)
      Inits.push_back(B.Vars[V++]->getInitializer());
    else
      Inits.push_back(Constant::getNullValue(Fields[FI]));
  }
  S->setInitializer(ConstantStruct::get(STy, Inits));
  for (GlobalVariable *GV : B.Vars)
    GV->eraseFromParent();
}

} // namespace

PreservedAnalyses MergeStaticsPass::run(Module &M, ModuleAnalysisManager &) {
  Owners O(M);
  std::set<const GlobalValue *> Used = usedSet(M);
  Bucket RO{"__bunkai_rodata", true, {}};
  Bucket Data{"__bunkai_data", false, {}};
  Bucket Bss{"__bunkai_bss", false, {}};
  std::vector<GlobalVariable *> Expose;

  for (GlobalVariable &GV : M.globals()) {
    if (GV.isDeclaration() || isPublic(GV) || GV.getName().startswith("llvm."))
      continue;
    const auto &Own = O.of(GV);
    unsigned Extracted = 0;
    for (const Function *F : Own)
      Extracted += F != Owners::Launcher;
    if (Extracted == 0 || O.soleOwner(GV))
      continue; // launcher-only, or moves with its one function
    if (GV.isThreadLocal() || !O.pinnedReason(GV).empty()) {
      Expose.push_back(&GV);
      continue;
    }
    if (GV.isConstant())
      RO.Vars.push_back(&GV);
    else if (GV.getInitializer()->isNullValue())
      Bss.Vars.push_back(&GV);
    else
      Data.Vars.push_back(&GV);
  }

  unsigned N = 0;
  for (GlobalVariable *GV : Expose) {
    std::string Name = Used.count(GV) ? GV->getName().str()
                                      : BUNKAI_GLOBAL_PREFIX + hex(N++);
    log() << "merge\texpose\t" << GV->getName() << "\t" << Name << "\t"
          << (GV->isThreadLocal() ? "thread-local" : O.pinnedReason(*GV))
          << "\n";
    GV->setName(Name);
    GV->setLinkage(GlobalValue::ExternalLinkage);
    GV->setVisibility(GlobalValue::DefaultVisibility);
    GV->setUnnamedAddr(GlobalValue::UnnamedAddr::None);
  }
  mergeBucket(M, RO);
  mergeBucket(M, Data);
  mergeBucket(M, Bss);
  return PreservedAnalyses::none();
}

} // namespace bunkai
