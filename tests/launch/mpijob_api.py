"""mpijob_api.py - hpdl's description of the MPIJob resource, for
validate_mpijob.py.

The facts (field names, types, enumerated values, required fields, integer
widths) are those of the Kubeflow MPI operator's API, kubeflow/mpi-operator,
version kubeflow.org/v2beta1; the pod template's fields are Kubernetes'
core/v1 ones. Only the fields an hpdl manifest can hold are listed: in the
pod template, what hpdlrun --k8s writes and a few fields beside them. The
values listed for runPolicy.cleanPodPolicy and a replica's restartPolicy are
the ones the operator defines; its server-side schema takes any string there,
so this check is the stricter one. The table's form, the names in it and the
code are hpdl's own.

FIELDS maps a path to (type, flags...). A path is a dotted list of field
names, where `*` stands for any key of a map and `[]` for any item of a list.
Types:
  object    a mapping holding only the fields listed under it
  map       a mapping from any string to what `PATH.*` says
  list      a list of what `PATH.[]` says
  open      any mapping (not looked into)
  string, bool, int32, int64
  quantity  a Kubernetes resource quantity: an integer, or a string QUANTITY
            matches (a signed decimal number, then a binary suffix Ki..Ei, a
            decimal suffix n u m k M G T P E, or an exponent e/E and a
            signed decimal number)
Flags: REQUIRED; a tuple of strings: the values allowed (for a map, the keys
allowed).
"""
import re

REQUIRED = "required"
INT_RANGE = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}

_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
QUANTITY = re.compile(rf"[+-]?{_NUMBER}(?:[KMGTPE]i|[numkMGTPE]|[eE][+-]?{_NUMBER})?")

RUN = "spec.runPolicy"
REPLICA = "spec.mpiReplicaSpecs.*"
POD = REPLICA + ".template.spec"
CONTAINER = POD + ".containers.[]"

FIELDS = {
    "": ("object",),
    "apiVersion": ("string", REQUIRED, ("kubeflow.org/v2beta1",)),
    "kind": ("string", REQUIRED, ("MPIJob",)),
    "metadata": ("open", REQUIRED),
    "spec": ("object", REQUIRED),
    "spec.slotsPerWorker": ("int32",),
    "spec.runLauncherAsWorker": ("bool",),
    "spec.sshAuthMountPath": ("string",),
    "spec.launcherCreationPolicy": ("string", ("AtStartup", "WaitForWorkersReady")),
    "spec.mpiImplementation": ("string", ("OpenMPI", "Intel", "MPICH")),
    RUN: ("object",),
    RUN + ".cleanPodPolicy": ("string", ("None", "Running", "All")),
    RUN + ".backoffLimit": ("int32",),
    RUN + ".activeDeadlineSeconds": ("int64",),
    RUN + ".ttlSecondsAfterFinished": ("int32",),
    RUN + ".suspend": ("bool",),
    RUN + ".managedBy": ("string",),
    RUN + ".schedulingPolicy": ("object",),
    RUN + ".schedulingPolicy.minAvailable": ("int32",),
    RUN + ".schedulingPolicy.queue": ("string",),
    RUN + ".schedulingPolicy.priorityClass": ("string",),
    RUN + ".schedulingPolicy.scheduleTimeoutSeconds": ("int32",),
    RUN + ".schedulingPolicy.minResources": ("map",),
    RUN + ".schedulingPolicy.minResources.*": ("quantity",),
    "spec.mpiReplicaSpecs": ("map", REQUIRED, ("Launcher", "Worker")),
    REPLICA: ("object",),
    REPLICA + ".replicas": ("int32",),
    REPLICA + ".restartPolicy": ("string", ("Always", "OnFailure", "Never", "ExitCode")),
    REPLICA + ".template": ("object",),
    REPLICA + ".template.metadata": ("object",),
    REPLICA + ".template.metadata.name": ("string",),
    REPLICA + ".template.metadata.namespace": ("string",),
    REPLICA + ".template.metadata.labels": ("map",),
    REPLICA + ".template.metadata.labels.*": ("string",),
    REPLICA + ".template.metadata.annotations": ("map",),
    REPLICA + ".template.metadata.annotations.*": ("string",),
    POD: ("object",),
    POD + ".restartPolicy": ("string",),
    POD + ".terminationGracePeriodSeconds": ("int64",),
    POD + ".nodeSelector": ("map",),
    POD + ".nodeSelector.*": ("string",),
    POD + ".volumes": ("list",),
    POD + ".volumes.[]": ("object",),
    POD + ".volumes.[].name": ("string", REQUIRED),
    POD + ".volumes.[].persistentVolumeClaim": ("object",),
    POD + ".volumes.[].persistentVolumeClaim.claimName": ("string", REQUIRED),
    POD + ".volumes.[].persistentVolumeClaim.readOnly": ("bool",),
    POD + ".containers": ("list", REQUIRED),
    CONTAINER: ("object",),
    CONTAINER + ".name": ("string", REQUIRED),
    CONTAINER + ".image": ("string",),
    CONTAINER + ".imagePullPolicy": ("string",),
    CONTAINER + ".workingDir": ("string",),
    CONTAINER + ".command": ("list",),
    CONTAINER + ".command.[]": ("string",),
    CONTAINER + ".args": ("list",),
    CONTAINER + ".args.[]": ("string",),
    CONTAINER + ".env": ("list",),
    CONTAINER + ".env.[]": ("object",),
    CONTAINER + ".env.[].name": ("string", REQUIRED),
    CONTAINER + ".env.[].value": ("string",),
    CONTAINER + ".resources": ("object",),
    CONTAINER + ".resources.limits": ("map",),
    CONTAINER + ".resources.limits.*": ("quantity",),
    CONTAINER + ".resources.requests": ("map",),
    CONTAINER + ".resources.requests.*": ("quantity",),
    CONTAINER + ".volumeMounts": ("list",),
    CONTAINER + ".volumeMounts.[]": ("object",),
    CONTAINER + ".volumeMounts.[].name": ("string", REQUIRED),
    CONTAINER + ".volumeMounts.[].mountPath": ("string", REQUIRED),
    CONTAINER + ".volumeMounts.[].readOnly": ("bool",),
    CONTAINER + ".volumeMounts.[].subPath": ("string",),
}
