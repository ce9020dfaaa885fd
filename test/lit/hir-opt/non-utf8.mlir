// Input that is not UTF-8 is an error at its first bad byte: file:line:col, the
// line (bad and control bytes shown as U+FFFD) and a caret.
// RUN: %python -c "open(r'%t', 'wb').write(b'func.func @f() {\n  func.return // caf\xc3\xa9 \xff\x01 end\n}\n')"
// RUN: not hir-opt %t 2>&1 | filecheck %s --strict-whitespace -DFILE=%t
// Every byte value: an error, not a traceback (byte 10 ends line 1).
// RUN: %python -c "open(r'%t.bin', 'wb').write(bytes(range(256)) * 2)"
// RUN: not hir-opt %t.bin 2>&1 | filecheck %s --check-prefix=BINARY -DFILE=%t.bin
// With --split-input-file the line is that of the whole file, and the other chunks
// are still processed.
// RUN: %python -c "open(r'%t.split', 'wb').write(b'func.func @f() {\n  func.return\n}\n// -----\n\n\x80\n// -----\nfunc.func @g() {\n  func.return\n}\n')"
// RUN: not hir-opt %t.split --split-input-file 2>/dev/null | filecheck %s --check-prefix=SPLIT
// RUN: not hir-opt %t.split --split-input-file 2>&1 >/dev/null | filecheck %s --check-prefix=SPLIT-ERROR -DFILE=%t.split

// The column counts characters: `é` is one.
// CHECK: {{^}}[[FILE]]:2:23: error: input is not UTF-8 text (invalid start byte: byte 0xff){{$}}
// CHECK-NEXT: {{^}}  func.return // café �� end{{$}}
// CHECK-NEXT: {{^}}                      ^{{$}}
// CHECK-NOT: Traceback

// BINARY: [[FILE]]:2:118: error: input is not UTF-8 text (invalid start byte: byte 0x80)
// BINARY-NOT: Traceback

// SPLIT: builtin.module {
// SPLIT: func.func @f()
// SPLIT: // -----
// SPLIT-NEXT: // -----
// SPLIT: func.func @g()

// SPLIT-ERROR: [[FILE]]:6:1: error: input is not UTF-8 text (invalid start byte: byte 0x80)
