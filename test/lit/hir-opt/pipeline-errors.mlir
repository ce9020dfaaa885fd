// An unknown pass or a bad pass option is an error on the -p text, like a pipeline
// syntax error: `pass-pipeline:1:col: error: ...`, the pipeline and a caret under the
// pass name or under the option. An unknown pass is told the closest names and
// hostir's passes. Options are spelt with dashes or underscores, and
// an error names an option as it was written.
// RUN: not hir-opt %s -p bogus 2>&1 | filecheck %s --strict-whitespace --check-prefix=UNKNOWN
// RUN: not hir-opt %s -p 'cse,dce,fusion-to-hirr' 2>&1 | filecheck %s --strict-whitespace --check-prefix=UNKNOWN-LATER
// RUN: not hir-opt %s -p 'cse,fusion-to-hir{backnd=cuda}' 2>&1 | filecheck %s --strict-whitespace --check-prefix=NO-OPTION
// RUN: not hir-opt %s -p 'cse{aggressive=true}' 2>&1 | filecheck %s --strict-whitespace --check-prefix=NO-OPTIONS
// RUN: not hir-opt %s -p 'stream-parallel{p2p-backend=ucc}' 2>&1 | filecheck %s --strict-whitespace --check-prefix=DASHES
// RUN: not hir-opt %s -p 'stream-parallel{p2p_backend=ucc}' 2>&1 | filecheck %s --strict-whitespace --check-prefix=UNDERSCORES
// RUN: not hir-opt %s -p 'hir-lowering{backend=cuda p2p-backend=ucc}' 2>&1 | filecheck %s --strict-whitespace --check-prefix=INNER
// RUN: not hir-opt %s -p 'stream-parallel{separate-sync-loop=maybe}' 2>&1 | filecheck %s --strict-whitespace --check-prefix=TYPE
// RUN: not hir-opt %s -p 'stream-parallel{separate-sync-loop}' 2>&1 | filecheck %s --strict-whitespace --check-prefix=NO-VALUE
// RUN: not hir-opt %s -p 'hir-lowering{p2p-backend=cuda p2p_backend=nccl}' 2>&1 | filecheck %s --strict-whitespace --check-prefix=TWICE
// Both spellings are accepted.
// RUN: hir-opt %s -p 'stream-parallel{p2p-backend=cuda separate_sync_loop=false}' | filecheck %s --check-prefix=OK
// RUN: hir-opt %s -p 'stream-parallel{p2p_backend=cuda separate-sync-loop=false}' | filecheck %s --check-prefix=OK

// UNKNOWN: {{^}}pass-pipeline:1:1: error: unknown pass 'bogus'; hostir's passes are {{.*}}copy-engine-pipelining, flatten-rows, forward-buffers, fusion-to-hir, hir-lowering, {{.*}}; `hir-opt --list-passes` lists them with xDSL's {{[0-9]+}} others{{$}}
// UNKNOWN-NEXT: {{^}}bogus{{$}}
// UNKNOWN-NEXT: {{^}}^^^^^{{$}}
// UNKNOWN-NOT: Traceback

// UNKNOWN-LATER: {{^}}pass-pipeline:1:9: error: unknown pass 'fusion-to-hirr' (did you mean 'fusion-to-hir'?); hostir's passes are
// UNKNOWN-LATER-NEXT: {{^}}cse,dce,fusion-to-hirr{{$}}
// UNKNOWN-LATER-NEXT: {{^}}        ^^^^^^^^^^^^^^{{$}}

// NO-OPTION: {{^}}pass-pipeline:1:19: error: pass 'fusion-to-hir' has no option 'backnd'; its options are {{.*}}backend
// NO-OPTION-NEXT: {{^}}cse,fusion-to-hir{backnd=cuda}{{$}}
// NO-OPTION-NEXT: {{^}}                  ^^^^^^{{$}}

// NO-OPTIONS: {{^}}pass-pipeline:1:5: error: pass 'cse' has no option 'aggressive'; it takes no options{{$}}

// DASHES: {{^}}pass-pipeline:1:17: error: stream-parallel: unknown p2p-backend 'ucc'; expected one of nccl, cuda{{$}}
// DASHES-NEXT: {{^}}stream-parallel{p2p-backend=ucc}{{$}}
// DASHES-NEXT: {{^}}                ^^^^^^^^^^^^^^^{{$}}

// UNDERSCORES: {{^}}pass-pipeline:1:17: error: stream-parallel: unknown p2p_backend 'ucc'; expected one of nccl, cuda{{$}}

// A value that a pass run inside hir-lowering refuses is still an error on hir-lowering's option.
// INNER: {{^}}pass-pipeline:1:27: error: hir-lowering: unknown p2p-backend 'ucc'; expected one of nccl, cuda{{$}}
// INNER-NEXT: {{^}}hir-lowering{backend=cuda p2p-backend=ucc}{{$}}
// INNER-NEXT: {{^}}                          ^^^^^^^^^^^^^^^{{$}}

// TYPE: {{^}}pass-pipeline:1:17: error: option 'separate-sync-loop' of pass 'stream-parallel' takes true or false, got 'maybe'{{$}}
// TYPE-NEXT: {{^}}stream-parallel{separate-sync-loop=maybe}{{$}}
// TYPE-NEXT: {{^}}                ^^^^^^^^^^^^^^^^^^^^^^^^{{$}}

// NO-VALUE: {{^}}pass-pipeline:1:17: error: option 'separate-sync-loop' of pass 'stream-parallel' takes true or false, got no value{{$}}

// TWICE: {{^}}pass-pipeline:1:31: error: option 'p2p_backend' of pass 'hir-lowering' is given twice{{$}}
// TWICE-NEXT: {{^}}hir-lowering{p2p-backend=cuda p2p_backend=nccl}{{$}}
// TWICE-NEXT: {{^}}                              ^^^^^^^^^^^^^^^^{{$}}

// OK: func.func @f

func.func @f(%x: !fusion.tensor<[4], f32>) -> !fusion.tensor<[4], f32> {
  func.return %x : !fusion.tensor<[4], f32>
}
