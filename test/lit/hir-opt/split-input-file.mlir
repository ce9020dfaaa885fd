// --split-input-file processes each `// -----` chunk on its own and joins the
// outputs with the same separator; --print-op-generic prints every chunk generically.
// RUN: hir-opt %s --split-input-file | filecheck %s
// RUN: hir-opt %s --split-input-file --print-op-generic | filecheck %s --check-prefix=GENERIC
// Without the option the chunks are one module, where @same is defined twice.
// RUN: not hir-opt %s 2>&1 | filecheck %s --check-prefix=WHOLE

// CHECK: builtin.module {
// CHECK-NEXT: func.func @same(%x: !fusion.tensor<[4], f32>)
// CHECK: // -----
// CHECK-NEXT: builtin.module {
// CHECK-NEXT: func.func @same(%x: !fusion.tensor<[2], bf16, mesh = [0, 1], axes = [didx]>)
// CHECK: // -----
// CHECK-NEXT: builtin.module {
// CHECK-NEXT: func.func @last()
// CHECK-NOT: // -----

// GENERIC: "builtin.module"() ({
// GENERIC: sym_name = "same"
// GENERIC: // -----
// GENERIC-NEXT: "builtin.module"() ({
// GENERIC: sym_name = "same"
// GENERIC: // -----
// GENERIC-NEXT: "builtin.module"() ({
// GENERIC: sym_name = "last"

// WHOLE: error: {{.*}}same

func.func @same(%x: !fusion.tensor<[4], f32>) {
  func.return
}

// -----

func.func @same(%x: !fusion.tensor<[2], bf16, mesh = [0, 1], axes = [didx]>) {
  func.return
}

// -----

func.func @last() {
  func.return
}
