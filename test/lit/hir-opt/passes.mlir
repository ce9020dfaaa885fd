// -p/--passes runs a comma-separated pipeline of hostir's passes and xDSL's cse,
// canonicalize and dce; --print-ir-after-all dumps the IR to stderr after each pass
// and xDSL's --print-between-passes prints it to stdout between passes.
// RUN: hir-opt %s -p cse | filecheck %s --check-prefix=CSE
// RUN: hir-opt %s --passes dce,canonicalize --print-ir-after-all 2>&1 >/dev/null | filecheck %s --check-prefix=AFTER
// RUN: hir-opt %s -p dce,canonicalize --print-between-passes | filecheck %s --check-prefix=BETWEEN

// CSE: %a = fusion.neg %x
// CSE-NOT: fusion.neg
// CSE: %sum = fusion.add %a, %a
// CSE: func.return %sum, %m

// AFTER: // -----// IR Dump After dce //----- //
// AFTER-NOT: fusion.exp
// AFTER: %a = fusion.neg %x
// AFTER-NEXT: %b = fusion.neg %x
// AFTER-NEXT: %sum = fusion.add %a, %b
// AFTER-NEXT: %c2 = arith.constant 2 : index
// AFTER-NEXT: %c3 = arith.constant 3 : index
// AFTER-NEXT: %c5 = arith.addi %c2, %c3 : index
// AFTER: // -----// IR Dump After canonicalize //----- //
// AFTER-NOT: arith.addi
// AFTER: %sum = fusion.add %a, %b
// AFTER-NEXT: %c5 = arith.constant 5 : index
// AFTER-NEXT: %m = arith.muli %n, %c5 : index
// AFTER-NOT: IR Dump

// BETWEEN: IR after dce:
// BETWEEN-NOT: fusion.exp
// BETWEEN: %c5 = arith.addi %c2, %c3 : index
// BETWEEN-NOT: IR after
// BETWEEN: builtin.module
// BETWEEN: %c5 = arith.constant 5 : index

func.func @f(%x: !fusion.tensor<[4], f32>, %n: index) -> (!fusion.tensor<[4], f32>, index) {
  %a = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[4], f32>
  %b = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[4], f32>
  %unused = fusion.exp %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[4], f32>
  %sum = fusion.add %a, %b : (!fusion.tensor<[4], f32>, !fusion.tensor<[4], f32>) -> !fusion.tensor<[4], f32>
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %c5 = arith.addi %c2, %c3 : index
  %m = arith.muli %n, %c5 : index
  func.return %sum, %m : !fusion.tensor<[4], f32>, index
}
