// MultiDeviceStreamParallelTypeTest.AllgatherP2p (pr4515): [DIDx(D), M] -> [Stream(D), M],
// gathered one device per iteration with coalesced sends and receives.

!in = !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _]>
!out = !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _]>

func.func @allgather_p2p(%in: !in) -> !out {
  %out = fusion.set %in : !in -> !out
  func.return %out : !out
}
