#!/usr/bin/env python3
"""An independent gRPC peer for tinkerbox's Tink server: plays tink-agent
(the current API) or tink-worker v0.12 through whole workflows, with
modules that grpcio-tools generated from the UPSTREAM .proto files
(tests/tink/grpc-venv). Prints one JSON object per line: what was served,
what was reported, the codes the server answered, and a final summary.

  peer.py STUBS agent ADDR AGENT_ID [--fail|--timeout|--hang ACTION] [--polls N] [--tls CA.pem]
  peer.py STUBS flood ADDR ID_BYTES --polls N   (GetAction with N distinct ids)
  peer.py STUBS worker ADDR WORKER_ID [--polls N]
  peer.py STUBS raw ADDR HEXBYTES      (send bytes to ReportActionStatus)

Every loop is bounded (--polls, default 200, 50 ms apart); every call has
a 5 s deadline.
"""
import argparse
import json
import sys
import time


def out(**kw):
    print(json.dumps(kw), flush=True)


def channel(a):
    import grpc
    if a.tls:
        with open(a.tls, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        return grpc.secure_channel(a.addr, creds)
    return grpc.insecure_channel(a.addr)


def agent(stubs, a):
    sys.path.insert(0, f"{stubs}/agent")
    import grpc
    import get_action_request_pb2 as req_pb
    import report_action_status_request_pb2 as rep_pb
    import workflow_service_pb2_grpc as svc
    from google.protobuf import timestamp_pb2

    ch = channel(a)
    stub = svc.WorkflowServiceStub(ch)
    # What tink-agent sends with every GetAction: the machine it runs on.
    attrs = req_pb.AgentAttributes(
        cpu=req_pb.CPU(total_cores=4, total_threads=8, processors=[req_pb.Processor(
            id=0, cores=4, threads=8, vendor="GenuineIntel", model="Core i5-8259U", capabilities=["vmx", "sse4_2"])]),
        memory=req_pb.Memory(total="16GB", usable="15GB"),
        block=[req_pb.Block(name="/dev/vda", drive_type="HDD", size="20GB", vendor="QEMU")],
        network=[req_pb.Network(name="eth0", mac=a.id, speed="1000Mb/s")],
        bios=req_pb.BIOS(vendor="SeaBIOS", version="1.16.2", release_date="04/01/2014"),
    )
    ran = 0
    codes = []
    for _ in range(a.polls):
        try:
            r = stub.GetAction(req_pb.ActionRequest(agent_id=a.id, agent_attributes=attrs), timeout=5)
        except grpc.RpcError as e:
            codes.append(e.code().name)
            out(event="get_action", code=e.code().name, details=e.details())
            if ran and e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                break
            time.sleep(0.05)
            continue
        ran += 1
        out(event="served", workflow=r.workflow_id, task=r.task_id, action=r.name, image=r.image,
            timeout=r.timeout, environment=list(r.environment), volumes=list(r.volumes), pid=r.pid)
        S = rep_pb.ActionStatusRequest
        base = dict(workflow_id=r.workflow_id, agent_id=a.id, task_id=r.task_id,
                    action_id=r.action_id, action_name=r.name)
        # As tink-agent: RUNNING with Go's zero time, then the outcome.
        zero = timestamp_pb2.Timestamp(seconds=-62135596800)
        stub.ReportActionStatus(S(action_state=S.RUNNING, execution_start=zero, execution_stop=zero,
                                  message=rep_pb.ActionMessage(message="running action"), **base), timeout=5)
        if r.name == a.hang:
            out(event="hung", action=r.name)
            break
        start = timestamp_pb2.Timestamp()
        start.GetCurrentTime()
        time.sleep(0.02)
        stop = timestamp_pb2.Timestamp()
        stop.GetCurrentTime()
        state, msg = S.SUCCESS, "action completed"
        if r.name == a.fail:
            state, msg = S.FAILED, "exit status 1"
        if r.name == a.timeout:
            state, msg = S.TIMEOUT, "action timed out"
        try:
            stub.ReportActionStatus(S(action_state=state, execution_start=start, execution_stop=stop,
                                      execution_duration="0s", message=rep_pb.ActionMessage(message=msg),
                                      **base), timeout=5)
            out(event="reported", action=r.name, state=S.StateType.Name(state))
        except grpc.RpcError as e:
            out(event="report", code=e.code().name, details=e.details())
        if state != S.SUCCESS:
            break
    out(event="done", ran=ran, codes=codes[-3:])


def worker(stubs, a):
    sys.path.insert(0, f"{stubs}/worker")
    import grpc
    import workflow_pb2 as pb
    import workflow_pb2_grpc as svc

    ch = grpc.insecure_channel(a.addr)
    stub = svc.WorkflowServiceStub(ch)
    ran = 0
    for _ in range(a.polls):
        ctxs = list(stub.GetWorkflowContexts(pb.WorkflowContextRequest(worker_id=a.id), timeout=5))
        if not ctxs:
            if ran:
                break
            time.sleep(0.05)
            continue
        for c in ctxs:
            actions = stub.GetWorkflowActions(pb.WorkflowActionsRequest(workflow_id=c.workflow_id), timeout=5).action_list
            act = actions[c.current_action_index]
            if act.worker_id != a.id:
                continue
            out(event="served", workflow=c.workflow_id, task=act.task_name, action=act.name,
                index=c.current_action_index, total=c.total_number_of_actions, environment=list(act.environment))
            for st in (pb.STATE_RUNNING, pb.STATE_SUCCESS):
                stub.ReportActionStatus(pb.WorkflowActionStatus(
                    workflow_id=c.workflow_id, task_name=act.task_name, action_name=act.name,
                    action_status=st, seconds=0, message="ok", worker_id=a.id), timeout=5)
            ran += 1
            # A report for an action that is not the current one is refused.
            try:
                stub.ReportActionStatus(pb.WorkflowActionStatus(
                    workflow_id=c.workflow_id, task_name=act.task_name, action_name=act.name,
                    action_status=pb.STATE_SUCCESS, worker_id=a.id), timeout=5)
                out(event="stale_report", code="OK")
            except grpc.RpcError as e:
                out(event="stale_report", code=e.code().name, details=e.details())
    out(event="done", ran=ran)


def flood(stubs, a):
    """--polls GetActions, each with a fresh agent id of ID bytes: what a
    hostile network can send (the gRPC limit is 1 MiB a message)."""
    sys.path.insert(0, f"{stubs}/agent")
    import grpc
    import get_action_request_pb2 as req_pb
    import workflow_service_pb2_grpc as svc

    stub = svc.WorkflowServiceStub(channel(a))
    size = int(a.id)
    codes = {}
    for i in range(a.polls):
        agent_id = (f"{i:08d}" * (size // 8 + 1))[:size]
        try:
            stub.GetAction(req_pb.ActionRequest(agent_id=agent_id), timeout=5)
            c = "OK"
        except grpc.RpcError as e:
            c = e.code().name
        codes[c] = codes.get(c, 0) + 1
    out(event="flood", codes=codes)


def raw(stubs, a):
    import grpc
    ch = grpc.insecure_channel(a.addr)
    call = ch.unary_unary("/proto.WorkflowService/ReportActionStatus",
                          request_serializer=lambda b: b, response_deserializer=lambda b: b)
    try:
        call(bytes.fromhex(a.id), timeout=5)
        out(event="raw", code="OK")
    except grpc.RpcError as e:
        out(event="raw", code=e.code().name, details=e.details())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("stubs")
    p.add_argument("role", choices=["agent", "worker", "raw", "flood"])
    p.add_argument("addr")
    p.add_argument("id")
    p.add_argument("--fail")
    p.add_argument("--timeout")
    p.add_argument("--hang", help="report RUNNING for this action, then stop")
    p.add_argument("--polls", type=int, default=200)
    p.add_argument("--tls", help="CA certificate (PEM): speak TLS, trusting it")
    a = p.parse_args()
    {"agent": agent, "worker": worker, "raw": raw, "flood": flood}[a.role](a.stubs, a)


if __name__ == "__main__":
    main()
