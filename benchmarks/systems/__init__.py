"""Systems benchmarks: what the swarm costs and survives, not what it learns (learning experiments are registrations
run by ``swarm-sim experiment``). One command each, a Markdown report under ``benchmarks/results/``.

* ``b1_gossip``, ``b1_gossip_libp2p`` -- B1: record visibility over hivemind and libp2p (coordinator in ``gossip``,
  peer launchers and memory in ``launch``, the libp2p peers in ``libp2p_peer``, statistics in ``gossip_summary``)
* ``b2_rollout``, ``b2_april``, ``b3_learner``, ``b8_vllm_speed`` -- engine and learner speed against their baselines
* ``b5_scale`` -- per-node cost from 10 to 10,000 simulated nodes
* ``soak``, ``soak_multiproc`` -- B9: memory and file growth over long runs, in-process and real processes
  (the in-process soak's probes in ``soak_probe``, its caps, verdict and report in ``soak_verdict``)
* ``flood``, ``sybil``, ``sybil_real`` -- attacks: index floods, sybil shares in-process and against real nodes
* ``netlab`` -- the network lab (namespaces: NAT, slow lossy links, dropped links); its real-node scenarios in
  ``netlab_join``
* ``vade`` -- VADE/DART prompt selection against uniform
* ``harness`` -- what they share: the results path, the --quick/--out options, writing a report, stopping a
  process they started
"""
