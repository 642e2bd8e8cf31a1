//===- Variables.h - the named C variables visible at a join point ----------===//
//
// After optimisation a C variable lives in whatever SSA value its latest
// llvm.dbg.value names. A forward dataflow over the CFG computes, for each
// variable, the value it holds at the start of each block: known when every
// incoming path agrees on one value, unknown otherwise (a dbg.value of
// undef, a DIExpression we cannot read, a fragment, or paths that disagree).
// Within a block the dbg.values before the join point are replayed. This is
// stricter than "latest dbg.value up the dominator tree": a variable
// reassigned on a path that bypasses the dominator is unknown, not stale.
//
// A variable in memory (llvm.dbg.declare of an alloca of a scalar type) is
// passed by value too: the pass loads it just before the sled. It is
// offered only when a store into it dominates the join point (so a sled
// never reports an uninitialised slot, e.g. a parameter at function entry
// before its spill). Aggregates in memory are left out.
//
// Visible: the variable's lexical scope encloses the join point's scope,
// and both belong to the same inlined instance. Shadowed names keep the
// innermost variable. Unnamed and '$'-prefixed names are left out.
//===----------------------------------------------------------------------===//
#ifndef BUNKAI_FLOW_VARIABLES_H
#define BUNKAI_FLOW_VARIABLES_H

#include "llvm/ADT/DenseMap.h"
#include "llvm/IR/DebugInfoMetadata.h"
#include "llvm/IR/Dominators.h"
#include "llvm/IR/Function.h"
#include "llvm/IR/Instructions.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace bunkai::flow {

struct Variable {
  std::string Name;
  llvm::Value *V = nullptr;               // the value, or
  llvm::AllocaInst *InMemory = nullptr;   // the slot to load it from
};

class Variables {
public:
  Variables(llvm::Function &F, llvm::DominatorTree &DT);

  // Visible variables at I (before it), for a join point whose source
  // location is Loc (null: the function's own scope). Order: parameters in
  // order, then locals by declaration line, then name.
  std::vector<Variable> at(llvm::Instruction *I, const llvm::DILocation *Loc);

private:
  using Key = std::pair<const llvm::DILocalVariable *, const llvm::DILocation *>;
  using State = std::map<Key, llvm::Value *>;

  static void transfer(const llvm::Instruction &I, State &S);
  void solve();

  llvm::Function &F;
  llvm::DominatorTree &DT;
  llvm::DenseMap<const llvm::BasicBlock *, State> In;
  std::map<Key, llvm::AllocaInst *> Declared;
  bool Solved = false;
};

} // namespace bunkai::flow

#endif
