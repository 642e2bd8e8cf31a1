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
// For every JOB it prints "ok <out.so>" or "err <out.so> <message>" on stdout,
// so the driver can show progress and name the failing function.
//
// Options: -O0..-O3 (code generation level), -keep-obj (leave <out>.o).
//===----------------------------------------------------------------------===//

#include "lld/Common/Driver.h"
#include "llvm/Bitcode/BitcodeReader.h"
#include "llvm/IR/Constants.h"
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

#include <iostream>
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

  // Returns an empty string on success, else the error text.
  std::string lower(const std::vector<std::string> &Ins, const std::string &Out,
                    const std::vector<std::string> &LinkTemplate,
                    bool KeepObj, bool Group) {
    LLVMContext Ctx;
    std::unique_ptr<Module> M;
    std::vector<std::string> Bodies; // group mode: each input's function
    for (const std::string &In : Ins) {
      auto Buf = MemoryBuffer::getFile(In);
      if (!Buf)
        return "cannot read " + In + ": " + Buf.getError().message();
      auto ModOr = parseBitcodeFile((*Buf)->getMemBufferRef(), Ctx);
      if (!ModOr)
        return "bad bitcode " + In + ": " + toString(ModOr.takeError());
      if (Group) {
        std::string Body;
        for (Function &F : **ModOr)
          if (!F.isDeclaration() && F.getName().startswith("__bunkai_f"))
            Body = F.getName().str();
        if (Body.empty())
          return In + " defines no __bunkai_f function";
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
    if (F[0] == "LINK") {
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
      std::string Err = L.lower(Ins, Out, LinkTemplate, KeepObj, F[0] == "GROUP");
      if (Err.empty()) {
        outs() << "ok\t" << Out << "\n";
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
