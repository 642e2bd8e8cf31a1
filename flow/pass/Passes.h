//===- Passes.h - the bunkai flow pass and its options ----------------------===//
//
// One pass, `bunkai-flow-jp` (JoinPoints.cpp): the compile-time half of
// source-based, binary-level dynamic weaving (seed 003, §3.1). It records
// an extended symbol table of join points (struct member accesses, function
// entries) in the section BKF_SECTION and places an unpatched XRay-style
// sled at each; the layout is section 1 of flow/include/bunkai_flow.h.
//
// Registered at OptimizerLastEP for clang-14 (`-fpass-plugin=BunkaiFlow.so`),
// so every optimisation has run before a sled exists, and by name for opt-14
// (`-passes='bunkai-flow-jp<structs=pkt;kinds=load+store>'`).
//===----------------------------------------------------------------------===//
#ifndef BUNKAI_FLOW_PASSES_H
#define BUNKAI_FLOW_PASSES_H

#include "llvm/ADT/StringRef.h"
#include "llvm/IR/PassManager.h"

#include <string>
#include <vector>

namespace bunkai::flow {

// What to instrument. Defaults come from the -bunkai-flow-* command-line
// options (clang: `-mllvm -bunkai-flow-structs=pkt`, which needs the plugin
// loaded early too: `bunkai flow cc` passes `-Xclang -load`); parameters in
// the pass name override them.
struct Options {
  std::vector<std::string> Functions; // empty: every function
  std::vector<std::string> Files;     // empty: every file; else suffix match
  std::vector<std::string> Structs;   // empty: every struct
  bool Load = true, Store = true, Addr = true, Entry = true;
  bool Locals = true;        // named C variables as operands
  bool After = false;        // also a sled after each access (<after> advice)
  unsigned MaxOperands = 8;  // register operands per sled ($base/$argN first)
  bool Verbose = false;      // why an access got no join point, on stderr
  std::string Error;         // a bad -bunkai-flow-* option, reported by run()

  static Options fromCommandLine();
  // "functions=a+b;files=x.c;structs=pkt;kinds=load+store+addr+entry;
  //  locals=0;max-operands=4;after;verbose" ('+' separates list items: opt splits
  //  pipelines at commas). Returns an error message or "".
  std::string parse(llvm::StringRef Params);

  bool wantFunction(llvm::StringRef Source, llvm::StringRef IR) const;
  bool wantFile(llvm::StringRef File) const;
  bool wantStruct(llvm::StringRef Struct) const;
};

struct JoinPointsPass : llvm::PassInfoMixin<JoinPointsPass> {
  Options Opts;
  explicit JoinPointsPass(Options O) : Opts(std::move(O)) {}
  llvm::PreservedAnalyses run(llvm::Module &M, llvm::ModuleAnalysisManager &);
};

} // namespace bunkai::flow

#endif
