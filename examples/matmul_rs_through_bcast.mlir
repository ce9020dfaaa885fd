// MultiDeviceStreamParallelTypeTest.matmul_RS_through_bcast (pr4387): a matmul whose
// weight is broadcast first, then the reduce-scatter of its partial sums.
// B [DIDx(D), K/D, N] -> broadcast [0, 2] -> [1, DIDx(D), 1, K/D, N];
// A [S, DIDx(D), D, M, K/D] @ that -> [Stream(S), DIDx(D), D, M, N] -> sum(1)
// -> [Stream(S), DIDx(D), M, N].

!a = !fusion.tensor<[?, 4, 4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [_, didx, _, _, _]>
!b = !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _]>
!bb = !fusion.tensor<[1, 4, 1, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [_, didx, _, _, _]>
!partial = !fusion.tensor<[?, 4, 4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, didx, _, _, _]>
!out = !fusion.tensor<[?, 4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, didx, _, _]>

func.func @matmul_rs_through_bcast(%a: !a, %b: !b) -> !out {
  %bb = fusion.broadcast %b [0, 2] : !b -> !bb
  %partial = fusion.matmul %a, %bb : (!a, !bb) -> !partial
  %out = fusion.sum %partial [1] : !partial -> !out
  func.return %out : !out
}
