"""Every setting the suite changes from its default, and why (checked by tests/unit/test_setting_overrides.py).

The product as shipped is every setting at its default, features combined. A test may change one
only when that setting is what it tests, or when it is an input a feature needs before it exists
at all (where the state lives, which servers or tokens a user has, which engine). A change that is
neither is a test of another product than the one users run.
"""

from __future__ import annotations

INPUTS: dict[str, str] = {
    "KERNELBRIDGE_STATE_DIR": "where a test's state lives: each test its own, as each user has",
    "KERNELBRIDGE_LABELS": "the run's label on every container, for the leftover check; changes no behaviour",
    "KERNELBRIDGE_SERVERS_CONFIG": "which host MCP servers the user has configured: an input, not a default",
    "KERNELBRIDGE_CLIENT_CONFIGS": "which MCP clients' files are read: a test names its own, never root's real ones",
    "KERNELBRIDGE_PROJECT": "a project directory the user names: an input",
    "KERNELBRIDGE_HTTP_TOKENS": "the HTTP tenants a deployment has: an input of serve --http",
    "KERNELBRIDGE_HTTP_TOKENS_FILE": "the HTTP tenants, from a file: an input of serve --http",
    "KERNELBRIDGE_RUNTIME": "which engine the machine has (podman, docker, kube): the tests of each engine name it",
    "KERNELBRIDGE_ENGINES": "remote engines a user lists: an input of the remote runtime",
    "KERNELBRIDGE_SSH_COMMAND": "how a remote engine is reached: an input of the ssh:// runtime",
    "KERNELBRIDGE_KUBE_NAMESPACE": "the cluster namespace an operator gives: an input of the kube runtime",
    "KERNELBRIDGE_KUBE_IMAGE": "the image name on the development cluster's node: an input of the kube tier",
    "KERNELBRIDGE_KUBE_IMAGE_LOADER": "how images reach the development cluster's node: an input of the kube tier",
    "KERNELBRIDGE_MOUNTS": "which host directories a user shares: an input; the mount tests are about it",
    "KERNELBRIDGE_IMAGE_PACKAGES": "the image of extra packages a user built: the bridge must expect that image",
    "KERNELBRIDGE_IMAGE_PROFILE": "the image a user built (full or minimal): the bridge must expect that image",
    "KERNELBRIDGE_RPC_FD": "the kernel's own end of its rpc socket: set by the agent, read by the sandbox's tests",
    "KERNELBRIDGE_PACKAGES_DIR": "where the sandbox's packages live inside it: the agent's own variable",
    "KERNELBRIDGE_AGENT_PID": "the agent's pid as the handover sees it: the test double's and the pod's own",
    "KERNELBRIDGE_RELAY_UID": "the handover's uid: the local test double runs it as the test's own user",
    "KERNELBRIDGE_TEST_SECRET": "a value of the test's own, planted to prove it never leaks",
}
"""Settings that are inputs: allowed in any test."""

WHOLE_FILES: dict[str, str] = {
    "tests/unit/test_config.py": "reading every setting, good and bad, is what this file tests",
    "tests/unit/test_config_mounts.py": "what a mount or an export directory may be is what this file tests",
    "tests/unit/test_packages_config.py": "reading the package settings is what this file tests",
    "tests/unit/test_hub_policy.py": "the operator's allow and deny settings are what this file tests",
    "tests/unit/test_setting_overrides.py": "it parses made-up test sources that name settings",
    "tests/integration/test_bad_settings.py": "a bad value of each setting is what this file tests",
    "tests/unit/test_server_render.py": "it checks messages that name the setting to change",
    "tests/unit/test_capabilities_host.py": "what the manual says of each setting is what this file tests",
    "tests/process/test_cli_servers.py": "what `kernelbridge servers` says of the policy settings is what it tests",
    "tests/unit/test_host_mcp_manual.py": "what the manual says of a denied server is what this file tests",
    "tests/unit/test_http_options.py": "the HTTP server's allowed hosts are what this file tests",
    "tests/unit/test_image.py": "the image's extra packages (and their settings) are what this file tests",
    "tests/unit/test_replay_gate.py": "replay's check of KERNELBRIDGE_ALLOW_UNLIMITED is what this file tests",
    "tests/unit/test_runtime_kube.py": "the handover container's environment is what it checks",
}
"""Files whose subject is the settings themselves: every setting they change is what they test."""

_MODULE_BRIDGE = (
    "one bridge serves every test of the module, each in a session of its own: more than the 8 default"
)

OVERRIDES: dict[tuple[str, str], str] = {
    (
        "tests/integration/test_server.py",
        "KERNELBRIDGE_DURABLE",
    ): "sessions that end with their bridge are what that test is about",
    ("tests/bridge_harness.py", "KERNELBRIDGE_ALLOW_UNLIMITED"): (
        "passed on from the suite's environment: the unprivileged run on cgroup v1 sets it, as setup says"
    ),
    ("tests/bridge_harness.py", "KERNELBRIDGE_MAX_SESSIONS"): _MODULE_BRIDGE,
    ("tests/bridge_harness.py", "KERNELBRIDGE_WARM_POOL"): (
        "local_bridge is the in-process server over the local test double, for the bridge's own logic"
    ),
    (
        "tests/faults/test_outside.py",
        "KERNELBRIDGE_IMAGE",
    ): "an image that does not exist is what the test is about",
    ("tests/faults/test_wedged.py", "KERNELBRIDGE_MAX_SESSIONS"): _MODULE_BRIDGE,
    ("tests/install/test_nonroot.py", "KERNELBRIDGE_ALLOW_UNLIMITED"): (
        "what setup tells this user to set: rootless podman on cgroup v1 enforces no limits"
    ),
    ("tests/integration/test_approval.py", "KERNELBRIDGE_APPROVE_TOOLS"): "approval is what this file tests",
    (
        "tests/integration/test_durable_sessions.py",
        "KERNELBRIDGE_AUTO_RESTORE",
    ): "the automatic restore is what that test is about",
    ("tests/integration/test_durable_sessions.py", "KERNELBRIDGE_DURABLE"): (
        "sessions that end with their bridge (DURABLE=0) are what that test is about"
    ),
    ("tests/integration/test_durable_sessions.py", "KERNELBRIDGE_IMAGE"): (
        "a bridge before that started another image (its warm sandbox not adopted) is what that test is about"
    ),
    ("tests/integration/test_durable_sessions.py", "KERNELBRIDGE_IDLE_TIMEOUT"): (
        "a detached sandbox ending itself after its idle timeout is what that test is about"
    ),
    (
        "tests/integration/test_files.py",
        "KERNELBRIDGE_IMAGE_BUDGET",
    ): "images over the budget are what that test is about",
    (
        "tests/integration/test_host_mcp.py",
        "KERNELBRIDGE_DENY_TOOLS",
    ): "a denied tool is what those tests are about",
    ("tests/integration/test_host_mcp.py", "KERNELBRIDGE_MAX_SESSIONS"): _MODULE_BRIDGE,
    ("tests/integration/test_host_mcp_rpc.py", "KERNELBRIDGE_MAX_SESSIONS"): _MODULE_BRIDGE,
    (
        "tests/integration/test_http_auth.py",
        "KERNELBRIDGE_HTTP_MAX_CALLS",
    ): "the per-token call cap is what that test is about",
    ("tests/integration/test_http_auth.py", "KERNELBRIDGE_HTTP_MAX_SESSIONS"): (
        "the per-token session cap is what that test is about"
    ),
    (
        "tests/integration/test_hub_edge.py",
        "KERNELBRIDGE_DENY_TOOLS",
    ): "a denied tool is what that test is about",
    (
        "tests/integration/test_hub_servers.py",
        "KERNELBRIDGE_DENY_TOOLS",
    ): "a denied tool is what that test is about",
    ("tests/integration/test_install_errors.py", "KERNELBRIDGE_ALLOW_UNLIMITED"): (
        "what limits the runtime enforces is what that test is about"
    ),
    ("tests/integration/test_install_errors.py", "MCP_BRIDGE_IMAGE"): (
        "the predecessor's variable naming an image of another kind is what that test is about"
    ),
    (
        "tests/integration/test_install_errors.py",
        "MCP_BRIDGE_TIMEOUT",
    ): "the predecessor's variable is what that test is about",
    ("tests/integration/test_jupyter_kernelspec.py", "KERNELBRIDGE_IMAGE"): (
        "a kernelspec that names a missing image is what that test is about"
    ),
    ("tests/integration/test_jupyter_kernelspec.py", "KERNELBRIDGE_MEMORY"): (
        "the kernelspec carrying the settings setup ran with is what that test is about"
    ),
    ("tests/integration/test_packages.py", "KERNELBRIDGE_MAX_SESSIONS"): _MODULE_BRIDGE,
    (
        "tests/integration/test_packages.py",
        "KERNELBRIDGE_PACKAGES",
    ): "the package policy is what those tests are about",
    (
        "tests/integration/test_packages.py",
        "KERNELBRIDGE_PACKAGES_MAX_BYTES",
    ): "the install caps are what that test is about",
    ("tests/integration/test_packages.py", "KERNELBRIDGE_PACKAGES_MAX_INSTALLS"): (
        "the install caps are what that test is about"
    ),
    (
        "tests/integration/test_packages_index.py",
        "KERNELBRIDGE_PACKAGES_CACHE",
    ): "the cache's budget is what those tests are about",
    ("tests/integration/test_packages_index.py", "KERNELBRIDGE_PACKAGES_MAX_BYTES"): (
        "downloads bounded by the caps are what those tests are about"
    ),
    ("tests/integration/test_packages_index.py", "KERNELBRIDGE_PACKAGES_MAX_INSTALLS"): (
        "refusals counted against the cap are what that test is about"
    ),
    (
        "tests/integration/test_sandbox_kernel.py",
        "Settings.image",
    ): "the sandbox image the fixture built, named for the kernel",
    (
        "tests/integration/test_sandbox_lifecycle.py",
        "KERNELBRIDGE_IMAGE",
    ): "a missing image is what that test is about",
    ("tests/integration/test_server_limits.py", "KERNELBRIDGE_WARM_POOL"): (
        "a first call without a warm pool is half of what that test is about"
    ),
    (
        "tests/integration/test_tracebacks.py",
        "KERNELBRIDGE_DENY_TOOLS",
    ): "a denied tool's traceback is what that test is about",
    ("tests/journeys/test_notebook_workflow.py", "KERNELBRIDGE_APPROVE_TOOLS"): (
        "the approval workflow of the README is what this journey is about"
    ),
    (
        "tests/kube/test_durable_pods.py",
        "KERNELBRIDGE_IDLE_TIMEOUT",
    ): "a pod ending itself after its idle timeout is what that test is about",
    (
        "tests/load/test_durable_flood.py",
        "KERNELBRIDGE_MAX_SESSIONS",
    ): "more sessions than the default is the load",
    ("tests/load/test_durable_load.py", "KERNELBRIDGE_MAX_SESSIONS"): "fifty sessions at once is the load",
    ("tests/load/test_load.py", "KERNELBRIDGE_MAX_SESSIONS"): "many sessions at once is the load",
    (
        "tests/load/test_load.py",
        "KERNELBRIDGE_WARM_POOL",
    ): "starts under load with a bigger pool are what that test is about",
    (
        "tests/runtime/test_remote.py",
        "Settings.engine",
    ): "the remote engine's endpoint is what those tests are about",
    (
        "tests/unit/test_info_store.py",
        "Settings.engine",
    ): "an engine URL that answers nothing: doctor then opens no engine, and only its drop of the kept info is seen",
    (
        "tests/runtime/test_remote.py",
        "Settings.runtime",
    ): "the runtime to select is what those tests are about",
    (
        "tests/runtime/test_selection.py",
        "Settings.engine",
    ): "how a runtime is selected is what this file tests",
    (
        "tests/runtime/test_selection.py",
        "Settings.runtime",
    ): "how a runtime is selected is what this file tests",
    (
        "tests/security/test_exports.py",
        "KERNELBRIDGE_EXPORT_DIR",
    ): "where exports may go is what those tests are about",
    ("tests/security/test_fuzz.py", "KERNELBRIDGE_MAX_SESSIONS"): _MODULE_BRIDGE,
    (
        "tests/security/test_host_mcp_attacks.py",
        "KERNELBRIDGE_DENY_TOOLS",
    ): "a denied tool under attack is what that test is about",
    (
        "tests/security/test_record.py",
        "KERNELBRIDGE_JOURNAL_BUDGET",
    ): "the journal's budget under a forged flood is what it tests",
    (
        "tests/security/test_tenants.py",
        "KERNELBRIDGE_HTTP_DISK_QUOTA",
    ): "a tenant's disk quota is what those tests are about",
    (
        "tests/security/test_tenants.py",
        "KERNELBRIDGE_HTTP_MAX_SESSIONS",
    ): "a tenant's session cap is what those tests are about",
    ("tests/security/test_tenants.py", "KERNELBRIDGE_MAX_SESSIONS"): _MODULE_BRIDGE,
    ("tests/unit/test_adoption_checks.py", "Settings.mounts"): (
        "a mount taken away between two bridges is what those checks are about"
    ),
    ("tests/unit/test_adoption_proof.py", "Settings.kernel_start_timeout"): (
        "the local double's agent starts slowly on a busy machine: a bound for it, not a behaviour"
    ),
    ("tests/unit/test_adoption_proof.py", "Settings.warm_pool"): (
        "sandboxes made by hand beside no registry: a pool would start one more"
    ),
    (
        "tests/unit/test_approval_policy.py",
        "KERNELBRIDGE_APPROVE_TOOLS",
    ): "the approval patterns are what this file tests",
    (
        "tests/unit/test_durable_handshake.py",
        "KERNELBRIDGE_JOURNAL_BUDGET",
    ): "a budget the test names in its message check",
    ("tests/unit/test_durable_handshake.py", "Settings.kernel_start_timeout"): (
        "the handshake's bound on a scripted sandbox is what those tests are about"
    ),
    ("tests/unit/test_host_sandbox.py", "Settings.kernel_start_timeout"): (
        "a sandbox that does not become ready in time is what that test is about"
    ),
    (
        "tests/unit/test_hub_rpc.py",
        "KERNELBRIDGE_DENY_SERVERS",
    ): "denied servers in the rpc answers are what those tests are about",
    (
        "tests/unit/test_hub_rpc.py",
        "KERNELBRIDGE_DENY_TOOLS",
    ): "denied tools in the rpc answers are what those tests are about",
    (
        "tests/unit/test_notebook_access.py",
        "Settings.mounts",
    ): "the mounts a notebook records are what this file tests",
    (
        "tests/unit/test_notebook_access.py",
        "Settings.packages",
    ): "the package policy a notebook records is what this file tests",
    (
        "tests/unit/test_notebook_bounds.py",
        "KERNELBRIDGE_HTTP_DISK_QUOTA",
    ): "the disk quota's message is what that test checks",
    (
        "tests/unit/test_notebook_bounds.py",
        "KERNELBRIDGE_JOURNAL_BUDGET",
    ): "the journal's budget is what those tests are about",
    (
        "tests/unit/test_notebook_bounds.py",
        "Settings.disk_quota",
    ): "a tenant's disk quota is what that test is about",
    (
        "tests/unit/test_notebook_bounds.py",
        "Settings.export_dir",
    ): "where exports go is what that test is about",
    ("tests/unit/test_notebook_bounds.py", "Settings.warm_pool"): (
        "a registry on the local double whose sandboxes the test counts: a pool would start one more"
    ),
    (
        "tests/process/test_packages_host_index.py",
        "KERNELBRIDGE_PACKAGES_CACHE",
    ): "the cache's budget is what those tests are about",
    (
        "tests/process/test_packages_host_index.py",
        "KERNELBRIDGE_PACKAGES_MAX_BYTES",
    ): "the byte cap is what those tests are about",
    (
        "tests/process/test_packages_host_index.py",
        "KERNELBRIDGE_PACKAGES_MAX_INSTALLS",
    ): "the install cap is what that test is about",
    (
        "tests/process/test_packages_host_index.py",
        "Settings.packages",
    ): "the package policy is what those tests are about",
    (
        "tests/unit/test_packages_service.py",
        "KERNELBRIDGE_PACKAGES_MAX_BYTES",
    ): "the byte cap is what those tests are about",
    (
        "tests/unit/test_packages_service.py",
        "KERNELBRIDGE_PACKAGES_MAX_INSTALLS",
    ): "the install cap is what those tests are about",
    (
        "tests/unit/test_packages_service.py",
        "Settings.packages",
    ): "the package policy is what those tests are about",
    ("tests/process/test_replay_bounds.py", "Settings.warm_pool"): (
        "a replay's registry on the local double whose sandboxes the test counts"
    ),
    ("tests/unit/test_server_start.py", "KERNELBRIDGE_WARM_POOL"): (
        "an engine held on purpose: a warm start would wait on it too, and the test counts what waits"
    ),
    (
        "tests/process/test_session_generations.py",
        "KERNELBRIDGE_HISTORY_BUDGET",
    ): "the history budget is what that test is about",
    (
        "tests/process/test_session_registry.py",
        "Settings.durable",
    ): "sessions that end with their registry are what that test is about",
    (
        "tests/process/test_session_registry.py",
        "Settings.idle_timeout",
    ): "idle reaping is what that test is about",
    (
        "tests/process/test_session_registry.py",
        "Settings.max_sessions",
    ): "the session limit is what those tests are about",
    ("tests/process/test_session_registry.py", "Settings.warm_pool"): (
        "registries on the local double whose sandboxes the tests count; the pool's own test sets it"
    ),
}
"""Each other change: (test file, setting) -> why that test changes it."""
