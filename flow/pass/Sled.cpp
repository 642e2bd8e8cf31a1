//===- Sled.cpp - one join point's sled and record, as inline assembly ------===//
#include "Sled.h"

#include "../include/bunkai_flow.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/IR/Constants.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/InlineAsm.h"
#include "llvm/IR/Instructions.h"

using namespace llvm;

namespace bunkai::flow {

// Text for `.ascii "..."` inside an LLVM inline-asm template: assembler
// escapes for the string, and '$' doubled (LLVM's operand marker; '%' is
// plain text in IR templates, it is clang that maps GCC's %0 to $0).
static std::string asciiEscape(StringRef S) {
  std::string Out;
  for (unsigned char C : S) {
    if (C == '$')
      Out += "$$";
    else if (C == '"' || C == '\\')
      Out += std::string("\\") + char(C);
    else if (C == '\t')
      Out += "\\t";
    else if (C < 0x20 || C >= 0x7f) {
      char Buf[8];
      snprintf(Buf, sizeof Buf, "\\%03o", C);
      Out += Buf;
    } else
      Out += char(C);
  }
  return Out;
}

// Fields are tab-separated and operands space-separated: neither may
// appear inside a field.
static std::string field(StringRef S) {
  std::string Out = S.str();
  for (char &C : Out)
    if (C == '\t' || C == '\n' || C == '\r')
      C = ' ';
  return Out.empty() ? "-" : Out;
}

namespace {
enum class How { Imm, Reg, Xmm, None };
}

static How howToPass(Value *V) {
  Type *T = V->getType();
  if (isa<UndefValue>(V))
    return How::None;
  if (auto *CI = dyn_cast<ConstantInt>(V))
    return CI->getBitWidth() <= 64 ? How::Imm : How::None;
  if (isa<ConstantPointerNull>(V))
    return How::Imm;
  // Other constants: a global's address (materialised PC-relative by a
  // lea) is useful; integer arithmetic on addresses is left out.
  if (isa<Constant>(V) && !T->isPointerTy())
    return How::None;
  if (T->isFloatTy() || T->isDoubleTy())
    return How::Xmm;
  if (T->isPointerTy())
    return How::Reg;
  if (auto *IT = dyn_cast<IntegerType>(T)) {
    unsigned W = IT->getBitWidth();
    if (W == 8 || W == 16 || W == 32 || W == 64)
      return How::Reg;
  }
  return How::None;
}

unsigned insertSled(Instruction *InsertPt, const Record &R,
                    const std::vector<Operand> &Ops, unsigned MaxRegs) {
  LLVMContext &Ctx = InsertPt->getContext();
  std::vector<Value *> Args;
  std::vector<Type *> ArgTypes;
  std::string Constraints;
  std::string OpText;
  DenseMap<Value *, unsigned> Index;
  unsigned Regs = 0, Xmms = 0, Dropped = 0;

  for (const Operand &Op : Ops) {
    Value *V = Op.V;
    auto It = Index.find(V);
    unsigned N;
    if (It != Index.end()) {
      N = It->second;
    } else {
      How H = howToPass(V);
      if (H == How::None || (H == How::Reg && Regs >= MaxRegs) ||
          (H == How::Xmm && Xmms >= MaxRegs)) {
        ++Dropped;
        continue;
      }
      Value *Arg = V;
      const char *C = "r";
      if (H == How::Imm) {
        C = "i";
        if (isa<ConstantPointerNull>(V))
          Arg = ConstantInt::get(Type::getInt64Ty(Ctx), 0);
      } else if (H == How::Xmm) {
        C = "x";
        ++Xmms;
      } else {
        ++Regs;
      }
      N = Args.size();
      Index[V] = N;
      Args.push_back(Arg);
      ArgTypes.push_back(Arg->getType());
      if (!Constraints.empty())
        Constraints += ",";
      Constraints += C;
    }
    if (!OpText.empty())
      OpText += " ";
    OpText += asciiEscape(Op.Name) + "=${" + std::to_string(N) + "}";
  }

  std::string Text = asciiEscape(field(R.Struct)) + "\\t" +
                     asciiEscape(field(R.Member)) + "\\t" +
                     asciiEscape(field(R.Function)) + "\\t" +
                     asciiEscape(field(R.File)) + "\\t" +
                     std::to_string(R.Line) + "\\t" + R.Access + "\\t" +
                     std::to_string(R.Bits) + "\\t" + OpText;

  // The sled, one 11-byte nop (2-byte aligned, so the patcher's 2-byte
  // store over its first two bytes is atomic), then the record. `0b` is the sled's address; the
  // difference `0b - .` is resolved by the static linker (R_X86_64_PC32),
  // leaving nothing for the dynamic linker and no text relocation.
  std::string Asm;
  raw_string_ostream OS(Asm);
  OS << ".p2align 1\n"
     << "0:\n"
     << ".byte 0x66,0x66,0x2e,0x0f,0x1f,0x84,0x00,0x00,0x00,0x00,0x00\n"
     << ".pushsection " << BKF_SECTION << ",\"a\",@progbits\n"
     << ".p2align 2\n"
     << ".long 0b - .\n"
     << ".long " << format_hex(BKF_JP_MAGIC, 10) << "\n"
     << ".short " << R.Kind << "\n"
     << ".short " << BKF_VERSION << "\n"
     << ".long 2f - 1f\n"
     << "1:\n"
     << ".ascii \"" << Text << "\"\n"
     << ".byte 0\n"
     << "2:\n"
     << ".p2align 2\n"
     << ".popsection";
  OS.flush();

  auto *FT = FunctionType::get(Type::getVoidTy(Ctx), ArgTypes, false);
  InlineAsm *IA = InlineAsm::get(FT, Asm, Constraints, /*hasSideEffects=*/true);
  CallInst *Call = CallInst::Create(FT, IA, Args, "", InsertPt);
  Call->setDebugLoc(InsertPt->getDebugLoc());
  // Touches no memory the program can see; never unwinds.
  Call->addFnAttr(Attribute::NoUnwind);
  Call->addFnAttr(Attribute::InaccessibleMemOnly);
  return Dropped;
}

} // namespace bunkai::flow
