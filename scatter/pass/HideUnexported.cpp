//===- HideUnexported.cpp - what the library does not export is hidden ----===//
//
// Shared-library launchers (--lib). A library's own link flags decide
// what it exports: a version script's "local: *" hides every name it does
// not list, as surely as hidden visibility does. Scattered, those names would
// have to cross from the function libraries to the launcher by name, and the
// launcher, linked with the same script, would hide them again. So a symbol
// the original library does not export is made hidden here, before the other
// passes: they then treat it like any static or hidden symbol (a function
// gets a __bunkai_s<hex> stub, shared data goes into the merged structs),
// and the launcher exports exactly the original's names plus its own
// __bunkai_ ones.
//
// -bunkai-exported=FILE: the names the original library exports (defined
// dynamic symbols, one a line), written by the driver from the original
// built with the same inputs and flags. Without it the pass does nothing.
//
// -bunkai-hide-data-only: executable launchers (issue 23, launcher size).
// An executable exports none of its own symbols unless its link flags ask
// (-rdynamic, a dynamic list) or a shared library it links refers to them,
// so its public variables are as private as static ones. Scattered, each
// variable several functions use stayed in the launcher under its name and
// was exported to the libraries: Vim's 1,997 globals cost about 40 bytes of
// dynamic symbol each. Hidden here, they go into the merged structs like
// static data. Functions keep their names (the startup files call main by
// name; a stub is exported only when a library takes its address).
//===----------------------------------------------------------------------===//
#include "Common.h"
#include "Passes.h"

#include "llvm/ADT/StringSet.h"
#include "llvm/IR/GlobalAlias.h"
#include "llvm/IR/GlobalIFunc.h"
#include "llvm/Support/MemoryBuffer.h"

using namespace llvm;

static cl::opt<std::string>
    ExportedFile("bunkai-exported",
                 cl::desc("names the original library exports, one a line"),
                 cl::init(""));
static cl::opt<bool>
    DataOnly("bunkai-hide-data-only",
             cl::desc("hide only variables (an executable's launcher)"),
             cl::init(false));

namespace bunkai {

PreservedAnalyses HideUnexportedPass::run(Module &M, ModuleAnalysisManager &) {
  if (ExportedFile.empty())
    return PreservedAnalyses::all();
  auto Buf = MemoryBuffer::getFile(ExportedFile);
  if (!Buf)
    report_fatal_error(Twine("bunkai-hide-unexported: cannot read ") + ExportedFile +
                       ": " + Buf.getError().message());
  StringSet<> Exported;
  SmallVector<StringRef, 256> Lines;
  (*Buf)->getBuffer().split(Lines, '\n', -1, /*KeepEmpty=*/false);
  for (StringRef L : Lines)
    Exported.insert(L);

  unsigned Hidden = 0;
  auto Hide = [&](GlobalValue &GV) {
    if (GV.isDeclaration() || !isPublic(GV) || GV.getName().startswith("llvm.") ||
        Exported.count(GV.getName()))
      return;
    log() << "hide\tunexported\t" << GV.getName() << "\n";
    GV.setVisibility(GlobalValue::HiddenVisibility);
    GV.setDSOLocal(true);
    Hidden++;
  };
  for (GlobalVariable &V : M.globals())
    Hide(V);
  if (!DataOnly) {
    for (Function &F : M)
      Hide(F);
    for (GlobalAlias &A : M.aliases())
      Hide(A);
    for (GlobalIFunc &I : M.ifuncs())
      Hide(I);
  }
  return Hidden ? PreservedAnalyses::none() : PreservedAnalyses::all();
}

} // namespace bunkai
