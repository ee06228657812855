// kir::verify: the kernel IR's invariants, checked on each distinct kernel a schedule lowers
// (after lowering and its rewrites) and by for_target, so a lowering bug is an InternalError
// naming the kernel and the broken rule rather than a wrong value or a crash in a renderer.
// The rules:
//  - every expression's type follows its op (binary operands alike, predicates I1, selects on
//    I1, loads of a buffer's compute type, bitcasts between types of one width, indices I64);
//  - buffers and variables are in range; stores go to output buffers, in the buffer's compute
//    type;
//  - a variable is declared (Declare, or a For's loop variable) before it is used or assigned,
//    in an enclosing scope, and assigned values of its declared type;
//  - exactly one range loop, reached from the body through blocks only (the ABI's [begin, end));
//  - the range loop's trip count uses parameters and constants only;
//  - a lanes loop sits inside a gpu_warp or gpu_block range loop, not inside another lanes loop
//    (its combine needs every lane), and combines a variable declared before it with Add, Mul,
//    Max or Min; one combining in lane order sits inside a gpu_warp range loop.
#pragma once

#include "codegen/kernel_ir.hpp"

namespace tessera::kir {

// InternalError("kernel NAME: ...") at the first rule broken.
void verify(const Kernel& kernel);

}  // namespace tessera::kir
