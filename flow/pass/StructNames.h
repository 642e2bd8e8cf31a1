//===- StructNames.h - C member names of IR struct fields -------------------===//
//
// IR knows a struct member only by its index, and indices are not C's:
// clang inserts padding arrays, packs bitfields into storage units and
// renames types that clash across translation units ("struct.pkt.0"). The
// member is therefore found by offset in the struct's DICompositeType:
// debug info (full -g) is required, and an access whose struct or member
// debug info does not describe gets no join point (and a reason with
// -bunkai-flow-verbose).
//===----------------------------------------------------------------------===//
#ifndef BUNKAI_FLOW_STRUCTNAMES_H
#define BUNKAI_FLOW_STRUCTNAMES_H

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/IR/DataLayout.h"
#include "llvm/IR/DebugInfoMetadata.h"
#include "llvm/IR/DerivedTypes.h"
#include "llvm/IR/Module.h"

#include <string>
#include <vector>

namespace bunkai::flow {

class StructNames {
public:
  explicit StructNames(const llvm::Module &M);

  // The C name of the struct (no "struct " prefix), or "" when the IR type
  // is not a C struct debug info describes.
  std::string structName(llvm::StructType *ST) const;
  // The C member at field Idx: its name; bitfields sharing one storage unit
  // are "a|b|c"; "" when unknown or unnamed (an anonymous union member).
  std::string memberName(llvm::StructType *ST, unsigned Idx) const;
  // The member's width in bits (a bitfield's storage unit).
  uint64_t memberBits(llvm::StructType *ST, unsigned Idx) const;

private:
  const llvm::DICompositeType *find(llvm::StructType *ST) const;

  const llvm::DataLayout &DL;
  llvm::StringMap<std::vector<const llvm::DICompositeType *>> ByName;
  mutable llvm::DenseMap<llvm::StructType *, const llvm::DICompositeType *>
      Cache;
};

} // namespace bunkai::flow

#endif
