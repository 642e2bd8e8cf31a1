//===- StructNames.cpp - C member names of IR struct fields -----------------===//
#include "StructNames.h"

#include "llvm/IR/DebugInfo.h"

using namespace llvm;

namespace bunkai::flow {

StructNames::StructNames(const Module &M) : DL(M.getDataLayout()) {
  DebugInfoFinder Finder;
  Finder.processModule(M);
  for (DIType *T : Finder.types()) {
    if (auto *C = dyn_cast<DICompositeType>(T)) {
      if (C->getTag() == dwarf::DW_TAG_structure_type && !C->isForwardDecl() &&
          !C->getName().empty())
        ByName[C->getName()].push_back(C);
    } else if (auto *D = dyn_cast<DIDerivedType>(T)) {
      // `typedef struct { ... } T;`: clang names the IR type "struct.T".
      if (D->getTag() != dwarf::DW_TAG_typedef || D->getName().empty())
        continue;
      auto *C = dyn_cast_or_null<DICompositeType>(D->getBaseType());
      if (C && C->getTag() == dwarf::DW_TAG_structure_type &&
          C->getName().empty() && !C->isForwardDecl())
        ByName[D->getName()].push_back(C);
    }
  }
}

// "struct.pkt" -> "pkt"; "struct.pkt.0" (a clash across translation units)
// -> "pkt" when "pkt.0" is no C name.
static std::string cName(const StringMap<std::vector<const DICompositeType *>>
                             &ByName,
                         StringRef IRName) {
  if (!IRName.consume_front("struct."))
    return "";
  if (ByName.count(IRName))
    return IRName.str();
  StringRef Base = IRName;
  while (true) {
    auto [Head, Tail] = Base.rsplit('.');
    unsigned N;
    if (Head == Base || Tail.getAsInteger(10, N))
      break;
    Base = Head;
    if (ByName.count(Base))
      return Base.str();
  }
  return "";
}

const DICompositeType *StructNames::find(StructType *ST) const {
  auto It = Cache.find(ST);
  if (It != Cache.end())
    return It->second;
  const DICompositeType *Found = nullptr;
  if (ST->hasName() && !ST->isOpaque()) {
    std::string Name = cName(ByName, ST->getName());
    if (!Name.empty()) {
      // Same name, several types (different TUs): the one of this size.
      uint64_t Bits = DL.getTypeAllocSizeInBits(ST);
      for (const DICompositeType *C : ByName.lookup(Name))
        if (C->getSizeInBits() == Bits ||
            alignTo(C->getSizeInBits(), 8) == DL.getTypeStoreSizeInBits(ST)) {
          Found = C;
          break;
        }
    }
  }
  Cache[ST] = Found;
  return Found;
}

std::string StructNames::structName(StructType *ST) const {
  const DICompositeType *C = find(ST);
  if (!C)
    return "";
  if (!C->getName().empty())
    return C->getName().str();
  return cName(ByName, ST->getName()); // the typedef name
}

uint64_t StructNames::memberBits(StructType *ST, unsigned Idx) const {
  if (Idx >= ST->getNumElements())
    return 0;
  return DL.getTypeSizeInBits(ST->getElementType(Idx)).getFixedSize();
}

std::string StructNames::memberName(StructType *ST, unsigned Idx) const {
  const DICompositeType *C = find(ST);
  if (!C || Idx >= ST->getNumElements())
    return "";
  uint64_t Off = DL.getStructLayout(ST)->getElementOffsetInBits(Idx);
  std::string Bitfields;
  for (const DINode *N : C->getElements()) {
    auto *D = dyn_cast<DIDerivedType>(N);
    if (!D || D->getTag() != dwarf::DW_TAG_member || D->isStaticMember())
      continue;
    if (D->isBitField()) {
      auto *Storage =
          dyn_cast_or_null<ConstantInt>(D->getStorageOffsetInBits());
      if (Storage && Storage->getZExtValue() == Off && !D->getName().empty()) {
        if (!Bitfields.empty())
          Bitfields += "|";
        Bitfields += D->getName().str();
      }
      continue;
    }
    if (D->getOffsetInBits() == Off)
      return D->getName().str(); // "" for an anonymous struct/union member
  }
  return Bitfields;
}

} // namespace bunkai::flow
