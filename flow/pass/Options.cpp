//===- Options.cpp - which join points the flow pass records ----------------===//
//
// Restricting the pass is for sled-count experiments (how much do N sleds
// cost?) and for keeping big programs' tables small; the default is every
// struct member access and every function entry.
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"

#include <algorithm>

using namespace llvm;

static cl::opt<std::string>
    ClFunctions("bunkai-flow-functions",
                cl::desc("bunkai flow: only join points in these functions "
                         "(comma-separated source or IR names)"),
                cl::init(""));
static cl::opt<std::string>
    ClFiles("bunkai-flow-files",
            cl::desc("bunkai flow: only join points in these source files "
                     "(comma-separated; a path matches itself or any path "
                     "ending in /PATH)"),
            cl::init(""));
static cl::opt<std::string>
    ClStructs("bunkai-flow-structs",
              cl::desc("bunkai flow: only accesses to these structs "
                       "(comma-separated, without 'struct ')"),
              cl::init(""));
static cl::opt<std::string>
    ClKinds("bunkai-flow-kinds",
            cl::desc("bunkai flow: kinds of join points, comma-separated "
                     "from load,store,addr,entry (access = load,store,addr)"),
            cl::init("load,store,addr,entry"));
static cl::opt<bool>
    ClLocals("bunkai-flow-locals",
             cl::desc("bunkai flow: pass named C variables as sled operands"),
             cl::init(true));
static cl::opt<bool>
    ClAfter("bunkai-flow-after",
            cl::desc("bunkai flow: also place a sled right after each "
                     "struct member access and before each return of a "
                     "function with an entry join point, for <after> advice "
                     "(doubles the sleds)"),
            cl::init(false));
static cl::opt<unsigned>
    ClMaxOperands("bunkai-flow-max-operands",
                  cl::desc("bunkai flow: register operands per sled"),
                  cl::init(8));
static cl::opt<bool>
    ClVerbose("bunkai-flow-verbose",
              cl::desc("bunkai flow: say why an access got no join point"),
              cl::init(false));

namespace bunkai::flow {

// More register operands than this at one sled and clang runs out of
// registers ("inline assembly requires more registers than available").
static constexpr unsigned MaxOperandsLimit = 12;

// Lists are comma-separated in -bunkai-flow-* options; in pass parameters
// '+' separates (opt's pipeline parser splits the pipeline at commas).
static std::vector<std::string> splitList(StringRef S) {
  SmallVector<StringRef, 8> Parts;
  std::string Norm = S.str();
  std::replace(Norm.begin(), Norm.end(), '+', ',');
  StringRef(Norm).split(Parts, ',', -1, /*KeepEmpty=*/false);
  std::vector<std::string> Out;
  for (StringRef P : Parts)
    if (!P.trim().empty())
      Out.push_back(P.trim().str());
  return Out;
}

static std::string setKinds(Options &O, StringRef S) {
  O.Load = O.Store = O.Addr = O.Entry = false;
  for (const std::string &K : splitList(S)) {
    if (K == "load")
      O.Load = true;
    else if (K == "store")
      O.Store = true;
    else if (K == "addr")
      O.Addr = true;
    else if (K == "entry")
      O.Entry = true;
    else if (K == "access")
      O.Load = O.Store = O.Addr = true;
    else
      return "unknown join-point kind '" + K +
             "' (use load, store, addr, entry or access)";
  }
  return "";
}

Options Options::fromCommandLine() {
  Options O;
  O.Functions = splitList(ClFunctions);
  O.Files = splitList(ClFiles);
  O.Structs = splitList(ClStructs);
  std::string Err = setKinds(O, ClKinds);
  if (!Err.empty())
    O.Error = "-bunkai-flow-kinds: " + Err;
  O.Locals = ClLocals;
  O.After = ClAfter;
  O.MaxOperands = ClMaxOperands;
  if (O.MaxOperands > MaxOperandsLimit)
    O.Error = "-bunkai-flow-max-operands: at most " + std::to_string(MaxOperandsLimit) +
              " (the compiler needs the other registers around a sled)";
  O.Verbose = ClVerbose;
  return O;
}

std::string Options::parse(StringRef Params) {
  SmallVector<StringRef, 8> Items;
  Params.split(Items, ';', -1, /*KeepEmpty=*/false);
  for (StringRef Item : Items) {
    auto [Key, Val] = Item.split('=');
    Key = Key.trim();
    if (Key == "functions")
      Functions = splitList(Val);
    else if (Key == "files")
      Files = splitList(Val);
    else if (Key == "structs")
      Structs = splitList(Val);
    else if (Key == "kinds") {
      std::string Err = setKinds(*this, Val);
      if (!Err.empty())
        return Err;
    } else if (Key == "locals")
      Locals = !(Val == "0" || Val == "false" || Val == "no");
    else if (Key == "no-locals")
      Locals = false;
    else if (Key == "max-operands") {
      if (Val.trim().getAsInteger(10, MaxOperands))
        return "max-operands wants a number, not '" + Val.str() + "'";
      if (MaxOperands > MaxOperandsLimit)
        return "max-operands: at most " + std::to_string(MaxOperandsLimit) +
               " (the compiler needs the other registers around a sled)";
    } else if (Key == "after")
      After = true;
    else if (Key == "verbose")
      Verbose = true;
    else
      return "unknown parameter '" + Key.str() +
             "' (functions, files, structs, kinds, locals, max-operands, "
             "after, verbose)";
  }
  return "";
}

bool Options::wantFunction(StringRef Source, StringRef IR) const {
  if (Functions.empty())
    return true;
  for (const std::string &F : Functions)
    if (Source == F || IR == F)
      return true;
  return false;
}

bool Options::wantFile(StringRef File) const {
  if (Files.empty())
    return true;
  for (const std::string &F : Files)
    if (File == F || (File.endswith(F) && File.size() > F.size() &&
                      File[File.size() - F.size() - 1] == '/'))
      return true;
  return false;
}

bool Options::wantStruct(StringRef Struct) const {
  if (Structs.empty())
    return true;
  for (const std::string &S : Structs)
    if (Struct == S)
      return true;
  return false;
}

} // namespace bunkai::flow
