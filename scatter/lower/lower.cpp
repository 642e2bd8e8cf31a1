//===- lower.cpp - bunkai-lower: bitcode -> object -> shared library --------===//
//
// Scattering a program makes one shared library per function: tens of
// thousands of tiny links for a program like demo1. Spawning clang or ld.lld
// per library costs ~20 ms each (most of it relocating libLLVM at start-up),
// so this helper does both steps in one process: LLVM's code generator writes
// the object to memory, and lld's ELF driver, called as a library, links it.
//
// Protocol (stdin, one record per line, fields separated by TAB):
//   LINK <arg> <arg> ...   the ld.lld argument template; "@IN@" and "@OUT@"
//                          are replaced per job (from `clang -### -shared`)
//   JOB <in.bc> <out.so>   lower one module
//   GROUP <out.so> <in.bc>...  link several modules (llvm::Linker) and
//                          lower the result: one library per group (§5.1).
//                          The functions' bodies become internal; the library
//                          exports one table instead, __bunkai_gtab: for the
//                          i-th input's function, its offset from the table
//                          (int32). No dynamic symbol or relocation per
//                          function, and the manager finds a body by index.
//   IDS <file>             (before JOB or GROUP) every function's id and stub
//                          symbol, "<hex id>\t<stub>" per line. With it, a
//                          library binds its calls (issue 23): a direct call
//                          of a function of the same group calls its body (no
//                          stub, no PLT); a direct call of another library's
//                          function calls through the library's own slot for
//                          it,
//                          __bunkai_gimp[k] (one `call *slot(%rip)`, as
//                          -fno-plt code does). Slots are zero in the file:
//                          the manager fills each with the stub when it
//                          opens the library, and with the body once that is
//                          loaded. __bunkai_gids is the slots' ids: the count,
//                          then the ids in increasing order. Taking a
//                          function's address still yields its stub, so
//                          function pointers compare equal everywhere.
// For every JOB it prints "ok <out.so> <codegen µs> <link µs>" or
// "err <out.so> <message>" on stdout, so the driver can show progress, say
// where the time went and name the failing function.
//
// Options: -O0..-O3 (code generation level), -keep-obj (leave <out>.o).
//===----------------------------------------------------------------------===//

#include "lld/Common/Driver.h"
#include "llvm/Bitcode/BitcodeReader.h"
#include "llvm/IR/Constants.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/InstIterator.h"
#include "llvm/IR/Instructions.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/Linker/Linker.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/Target/TargetOptions.h"

#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace llvm;

namespace {

std::vector<std::string> splitTabs(const std::string &Line) {
  std::vector<std::string> Out;
  size_t Start = 0;
  while (true) {
    size_t Tab = Line.find('\t', Start);
    Out.push_back(Line.substr(Start, Tab == std::string::npos ? std::string::npos
                                                              : Tab - Start));
    if (Tab == std::string::npos)
      break;
    Start = Tab + 1;
  }
  return Out;
}

// Function attributes carry target-cpu/features per function, so one
// TargetMachine per triple with the generic CPU is enough (as llc does).
class Lowerer {
public:
  explicit Lowerer(CodeGenOpt::Level Level) : Level(Level) {}

  // IDS: stub symbol -> function id. Returns an error text, or "".
  std::string readIds(const std::string &Path) {
    std::ifstream In(Path);
    if (!In)
      return "cannot read " + Path;
    StubIds.clear();
    std::string Line;
    while (std::getline(In, Line)) {
      size_t Tab = Line.find('\t');
      if (Tab == std::string::npos || Tab == 0)
        return "bad line in " + Path + ": " + Line;
      StubIds[Line.substr(Tab + 1)] =
          (uint32_t)std::stoul(Line.substr(0, Tab), nullptr, 16);
    }
    return "";
  }

  // Returns an empty string on success, else the error text.
  // CodegenUs and LinkUs: how long reading plus code generation, and lld,
  // took.
  std::string lower(const std::vector<std::string> &Ins, const std::string &Out,
                    const std::vector<std::string> &LinkTemplate,
                    bool KeepObj, bool Group, long &CodegenUs, long &LinkUs) {
    auto T0 = std::chrono::steady_clock::now();
    LLVMContext Ctx;
    std::unique_ptr<Module> M;
    std::vector<std::string> Bodies; // each input's function (with IDS or GROUP)
    for (const std::string &In : Ins) {
      auto Buf = MemoryBuffer::getFile(In);
      if (!Buf)
        return "cannot read " + In + ": " + Buf.getError().message();
      auto ModOr = parseBitcodeFile((*Buf)->getMemBufferRef(), Ctx);
      if (!ModOr)
        return "bad bitcode " + In + ": " + toString(ModOr.takeError());
      if (Group || !StubIds.empty()) {
        std::string Body;
        for (Function &F : **ModOr)
          if (!F.isDeclaration() && F.getName().startswith("__bunkai_f"))
            Body = F.getName().str();
        if (Body.empty() && Group)
          return In + " defines no __bunkai_f function";
        if (!Body.empty())
          Bodies.push_back(Body);
      }
      if (!M) {
        M = std::move(*ModOr);
        continue;
      }
      // Private and internal names that collide are renamed by the linker;
      // declarations of the launcher's symbols merge.
      if (Linker::linkModules(*M, std::move(*ModOr)))
        return "cannot link " + In + " into the group";
    }
    if (!M)
      return "no input modules";
    if (Group) {
      Type *I32 = Type::getInt32Ty(Ctx);
      Type *I64 = Type::getInt64Ty(Ctx);
      auto *ArrTy = ArrayType::get(I32, Bodies.size());
      auto *Tab = new GlobalVariable(*M, ArrTy, /*isConstant=*/true,
                                     GlobalValue::ExternalLinkage, nullptr,
                                     "__bunkai_gtab");
      // Protected: exported for dlsym, but not preemptible, so the
      // differences below are resolved by the static link.
      Tab->setVisibility(GlobalValue::ProtectedVisibility);
      std::vector<Constant *> Elems;
      for (const std::string &B : Bodies) {
        Function *F = M->getFunction(B);
        if (!F)
          return "function " + B + " vanished while linking the group";
        F->setLinkage(GlobalValue::InternalLinkage);
        Constant *D = ConstantExpr::getSub(ConstantExpr::getPtrToInt(F, I64),
                                           ConstantExpr::getPtrToInt(Tab, I64));
        Elems.push_back(ConstantExpr::getTrunc(D, I32));
      }
      Tab->setInitializer(ConstantArray::get(ArrTy, Elems));
    }
    if (!StubIds.empty())
      bindCalls(*M, Bodies);

    TargetMachine *TM = machineFor(M->getTargetTriple());
    if (!TM)
      return "no target for triple '" + M->getTargetTriple() + "'";
    M->setDataLayout(TM->createDataLayout());

    std::string ObjPath = Out + ".o";
    {
      std::error_code EC;
      raw_fd_ostream OS(ObjPath, EC, sys::fs::OF_None);
      if (EC)
        return "cannot write " + ObjPath + ": " + EC.message();
      legacy::PassManager PM;
      if (TM->addPassesToEmitFile(PM, OS, nullptr, CGFT_ObjectFile))
        return "target cannot emit object files";
      PM.run(*M);
    }
    auto T1 = std::chrono::steady_clock::now();
    CodegenUs = std::chrono::duration_cast<std::chrono::microseconds>(T1 - T0).count();

    std::vector<std::string> Args;
    for (const auto &A : LinkTemplate)
      Args.push_back(A == "@IN@" ? ObjPath : A == "@OUT@" ? Out : A);
    std::vector<const char *> Argv;
    for (const auto &A : Args)
      Argv.push_back(A.c_str());
    std::string Err;
    raw_string_ostream ErrOS(Err);
    bool Ok = lld::elf::link(Argv, outs(), ErrOS, /*exitEarly=*/false,
                             /*disableOutput=*/false);
    lld::CommonLinkerContext::destroy();
    if (!KeepObj)
      sys::fs::remove(ObjPath);
    LinkUs = std::chrono::duration_cast<std::chrono::microseconds>(
                 std::chrono::steady_clock::now() - T1).count();
    if (!Ok) {
      std::string Msg = ErrOS.str();
      for (char &C : Msg)
        if (C == '\n' || C == '\t')
          C = ' ';
      return "link failed: " + Msg;
    }
    return "";
  }

private:
  // Issue 23: calls of the group's own functions go to their bodies, calls
  // of other groups' functions through the group's slots (see IDS above).
  void bindCalls(Module &M, const std::vector<std::string> &Bodies) {
    LLVMContext &Ctx = M.getContext();
    std::map<uint32_t, Function *> Local; // id -> body in this group
    for (const std::string &B : Bodies)
      Local[(uint32_t)std::stoul(B.substr(strlen("__bunkai_f")), nullptr, 16)] =
          M.getFunction(B);
    std::vector<CallBase *> Calls;
    for (Function &F : M)
      for (Instruction &I : instructions(F))
        if (auto *CB = dyn_cast<CallBase>(&I))
          if (auto *Callee = dyn_cast<Function>(
                  CB->getCalledOperand()->stripPointerCasts()))
            if (Callee->isDeclaration() && StubIds.count(Callee->getName().str()))
              Calls.push_back(CB);
    std::map<uint32_t, unsigned> Slot; // id -> slot, for other libraries' functions
    for (CallBase *CB : Calls) {
      auto *Callee = cast<Function>(CB->getCalledOperand()->stripPointerCasts());
      uint32_t Id = StubIds[Callee->getName().str()];
      if (!Local.count(Id))
        Slot[Id] = 0;
    }
    Type *I8P = Type::getInt8PtrTy(Ctx);
    GlobalVariable *Gimp = nullptr;
    ArrayType *SlotsTy = ArrayType::get(I8P, Slot.size());
    if (!Slot.empty()) {
      std::vector<uint32_t> Ids{(uint32_t)Slot.size()};
      unsigned K = 0;
      for (auto &KV : Slot) {
        KV.second = K++;
        Ids.push_back(KV.first);
      }
      // Zero in the file: the manager fills every slot (the callee's stub,
      // or its body) before the library's code can run, so loading the
      // library costs no relocation or symbol lookup per slot. Written by
      // the manager, so not constant.
      Gimp = new GlobalVariable(M, SlotsTy, /*isConstant=*/false,
                                GlobalValue::ExternalLinkage,
                                ConstantAggregateZero::get(SlotsTy), "__bunkai_gimp");
      Gimp->setVisibility(GlobalValue::ProtectedVisibility);
      Gimp->setAlignment(Align(8));
      auto *Gids = new GlobalVariable(
          M, ArrayType::get(Type::getInt32Ty(Ctx), Ids.size()), /*isConstant=*/true,
          GlobalValue::ExternalLinkage, ConstantDataArray::get(Ctx, Ids),
          "__bunkai_gids");
      Gids->setVisibility(GlobalValue::ProtectedVisibility);
    }
    for (CallBase *CB : Calls) {
      Value *Old = CB->getCalledOperand();
      auto *Callee = cast<Function>(Old->stripPointerCasts());
      uint32_t Id = StubIds[Callee->getName().str()];
      auto L = Local.find(Id);
      if (L != Local.end()) {
        CB->setCalledOperand(ConstantExpr::getBitCast(L->second, Old->getType()));
        continue;
      }
      IRBuilder<> B(CB);
      Value *P = B.CreateConstInBoundsGEP2_32(SlotsTy, Gimp, 0, Slot[Id]);
      LoadInst *Fn = B.CreateAlignedLoad(I8P, P, Align(8));
      // Another thread may be storing the body's address into it.
      Fn->setAtomic(AtomicOrdering::Unordered);
      CB->setCalledOperand(B.CreateBitCast(Fn, Old->getType()));
    }
  }

  TargetMachine *machineFor(const std::string &Triple) {
    if (TM && TMTriple == Triple)
      return TM.get();
    std::string Err;
    const Target *T = TargetRegistry::lookupTarget(Triple, Err);
    if (!T)
      return nullptr;
    TargetOptions Opts;
    TM.reset(T->createTargetMachine(Triple, "x86-64", "", Opts, Reloc::PIC_,
                                    CodeModel::Small, Level));
    TMTriple = Triple;
    return TM.get();
  }

  CodeGenOpt::Level Level;
  std::unique_ptr<TargetMachine> TM;
  std::string TMTriple;
  std::map<std::string, uint32_t> StubIds;
};

} // namespace

int main(int argc, char **argv) {
  CodeGenOpt::Level Level = CodeGenOpt::Default;
  bool KeepObj = false;
  for (int I = 1; I < argc; ++I) {
    std::string A = argv[I];
    if (A == "-O0")
      Level = CodeGenOpt::None;
    else if (A == "-O1")
      Level = CodeGenOpt::Less;
    else if (A == "-O2" || A == "-Os" || A == "-Oz")
      Level = CodeGenOpt::Default;
    else if (A == "-O3")
      Level = CodeGenOpt::Aggressive;
    else if (A == "-keep-obj")
      KeepObj = true;
    else {
      errs() << "bunkai-lower: unknown option " << A
             << " (use -O0..-O3, -keep-obj)\n";
      return 2;
    }
  }
  InitializeAllTargetInfos();
  InitializeAllTargets();
  InitializeAllTargetMCs();
  InitializeAllAsmPrinters();

  Lowerer L(Level);
  std::vector<std::string> LinkTemplate;
  std::string Line;
  int Failures = 0;
  while (std::getline(std::cin, Line)) {
    if (Line.empty())
      continue;
    std::vector<std::string> F = splitTabs(Line);
    if (F[0] == "IDS" && F.size() == 2) {
      std::string Err = L.readIds(F[1]);
      if (!Err.empty()) {
        errs() << "bunkai-lower: " << Err << "\n";
        return 2;
      }
    } else if (F[0] == "LINK") {
      LinkTemplate.assign(F.begin() + 1, F.end());
      // lld's driver expects argv[0].
      LinkTemplate.insert(LinkTemplate.begin(), "ld.lld");
    } else if ((F[0] == "JOB" && F.size() == 3) ||
               (F[0] == "GROUP" && F.size() >= 3)) {
      if (LinkTemplate.empty()) {
        errs() << "bunkai-lower: " << F[0] << " before LINK\n";
        return 2;
      }
      std::vector<std::string> Ins;
      std::string Out;
      if (F[0] == "JOB") {
        Ins.push_back(F[1]);
        Out = F[2];
      } else {
        Out = F[1];
        Ins.assign(F.begin() + 2, F.end());
      }
      long CodegenUs = 0, LinkUs = 0;
      std::string Err = L.lower(Ins, Out, LinkTemplate, KeepObj, F[0] == "GROUP",
                                CodegenUs, LinkUs);
      if (Err.empty()) {
        outs() << "ok\t" << Out << "\t" << CodegenUs << "\t" << LinkUs << "\n";
      } else {
        outs() << "err\t" << Out << "\t" << Err << "\n";
        ++Failures;
      }
      outs().flush();
    } else {
      errs() << "bunkai-lower: bad input line: " << Line << "\n";
      return 2;
    }
  }
  return Failures ? 1 : 0;
}
