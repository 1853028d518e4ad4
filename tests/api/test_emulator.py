"""
The emulator's strictness rules, checked through the real `kubernetes` client and plain HTTP,
and a kopf operator running against it in its own thread.
"""
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import kopf
import kubernetes.client
import kubernetes.config
import pytest
from kubernetes.client.exceptions import ApiException

from tests.support.harness import KopfThread, KubernetesApiEmulator

pytestmark = pytest.mark.emulator

RUNTIMECLASSES = '/apis/node.k8s.io/v1/runtimeclasses'
POLICIES = '/apis/katasizing.dev/v1alpha1/katasizingpolicies'


@pytest.fixture
def api_client(emulator: KubernetesApiEmulator) -> Iterator[kubernetes.client.ApiClient]:
    with kubernetes.config.new_client_from_config(config_file=str(emulator.kubeconfig)) as client:
        yield client


def http(emu: KubernetesApiEmulator, method: str, path: str, body: Any = None,
         content_type: str = 'application/json') -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(emu.base_url + path, method=method, data=data,
                                     headers={'Content-Type': content_type})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def watch(emu: KubernetesApiEmulator, path: str, **params: str) -> list[dict[str, Any]]:
    """Read a whole watch stream; it must end by itself (timeoutSeconds, 410, or a dropped watch)."""
    query = urllib.parse.urlencode({'watch': 'true', **params})
    with urllib.request.urlopen(f'{emu.base_url}{path}?{query}', timeout=10) as response:
        return [json.loads(line) for line in response if line.strip()]


def wait_for(condition: Callable[[], Any], timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError("The condition was not met in time.")
        time.sleep(0.05)
    return result


def runtime_class(name: str, handler: str | None = None, **extra: Any) -> dict[str, Any]:
    return {'apiVersion': 'node.k8s.io/v1', 'kind': 'RuntimeClass', 'metadata': {'name': name},
            'handler': handler or name, **extra}


def policy(name: str, **spec: Any) -> dict[str, Any]:
    return {'apiVersion': 'katasizing.dev/v1alpha1', 'kind': 'KataSizingPolicy',
            'metadata': {'name': name}, 'spec': {'shim': 'qemu-runtime-rs', **spec}}


def test_create_answers_201_and_stamps_server_fields(emulator, api_client):
    core = kubernetes.client.CoreV1Api(api_client)
    created, status, _ = core.create_namespaced_config_map_with_http_info(
        'default', {'metadata': {'name': 'cm'}, 'data': {'k': 'v'}})
    assert status == 201
    meta = created.metadata
    assert meta.uid and meta.creation_timestamp and meta.resource_version.isdigit()
    second = core.create_namespaced_config_map('default', {'metadata': {'name': 'cm2'}})
    assert int(second.metadata.resource_version) > int(meta.resource_version)
    assert emulator.objects('configmaps').get('cm', 'default')['metadata']['generation'] == 1


def test_duplicates_are_409_and_missing_objects_are_404_with_a_status_body(emulator, api_client):
    node = kubernetes.client.NodeV1Api(api_client)
    node.create_runtime_class(runtime_class('kata-s'))
    with pytest.raises(ApiException) as duplicate:
        node.create_runtime_class(runtime_class('kata-s'))
    assert duplicate.value.status == 409
    assert json.loads(duplicate.value.body)['reason'] == 'AlreadyExists'

    for method in ('GET', 'PATCH', 'DELETE'):
        status, body = http(emulator, method, f'{RUNTIMECLASSES}/absent', {} if method == 'PATCH' else None,
                            content_type='application/merge-patch+json')
        assert status == 404
        assert body['kind'] == 'Status' and body['reason'] == 'NotFound' and body['code'] == 404
        assert body['message'] == 'runtimeclasses.node.k8s.io "absent" not found'


def test_put_with_a_stale_resource_version_is_409_conflict(api_client):
    node = kubernetes.client.NodeV1Api(api_client)
    created = node.create_runtime_class(runtime_class('kata-m', overhead={'podFixed': {'memory': '100Mi'}}))
    stale = created.to_dict()
    fresh = node.replace_runtime_class('kata-m', dict(stale, overhead={'podFixed': {'memory': '200Mi'}}))
    assert fresh.metadata.resource_version != created.metadata.resource_version
    with pytest.raises(ApiException) as error:
        node.replace_runtime_class('kata-m', dict(stale, overhead={'podFixed': {'memory': '300Mi'}}))
    assert error.value.status == 409
    assert json.loads(error.value.body)['reason'] == 'Conflict'
    assert node.read_runtime_class('kata-m').overhead.pod_fixed == {'memory': '200Mi'}


def test_json_patch_test_op_failure_is_422_and_changes_nothing(emulator):
    emulator.objects('runtimeclasses').create(runtime_class('kata-l'))
    version = emulator.objects('runtimeclasses').get('kata-l')['metadata']['resourceVersion']
    ops = [{'op': 'test', 'path': '/metadata/resourceVersion', 'value': '999'},
           {'op': 'add', 'path': '/metadata/labels', 'value': {'a': 'b'}}]
    status, body = http(emulator, 'PATCH', f'{RUNTIMECLASSES}/kata-l', ops, 'application/json-patch+json')
    assert status == 422 and body['kind'] == 'Status'
    assert emulator.objects('runtimeclasses').get('kata-l')['metadata']['resourceVersion'] == version

    ops[0]['value'] = version
    status, body = http(emulator, 'PATCH', f'{RUNTIMECLASSES}/kata-l', ops, 'application/json-patch+json')
    assert status == 200 and body['metadata']['labels'] == {'a': 'b'}


def test_merge_and_strategic_patches(emulator, api_client):
    node = kubernetes.client.NodeV1Api(api_client)
    node.create_runtime_class(runtime_class('kata-xl', scheduling={'nodeSelector': {'a': '1', 'b': '2'}}))
    # A dict body makes the client send a strategic-merge patch.
    patched = node.patch_runtime_class('kata-xl', {'scheduling': {'nodeSelector': {'b': None, 'c': '3'}}})
    assert patched.scheduling.node_selector == {'a': '1', 'c': '3'}
    status, body = http(emulator, 'PATCH', f'{RUNTIMECLASSES}/kata-xl',
                        {'metadata': {'labels': {'x': 'y'}}}, 'application/merge-patch+json')
    assert status == 200 and body['metadata']['labels'] == {'x': 'y'}
    assert emulator.requests('PATCH')[-1].body == {'metadata': {'labels': {'x': 'y'}}}


def test_status_is_kept_apart_and_generation_tracks_spec_only(emulator, api_client):
    custom = kubernetes.client.CustomObjectsApi(api_client)
    args = ('katasizing.dev', 'v1alpha1', 'katasizingpolicies', 'p')
    created = custom.create_cluster_custom_object(*args[:3], dict(policy('p'), status={'bogus': True}))
    assert 'status' not in created and created['metadata']['generation'] == 1

    custom.patch_cluster_custom_object(*args, {'status': {'ignored': True}, 'metadata': {'labels': {'l': 'v'}}})
    after_metadata = custom.get_cluster_custom_object(*args)
    assert 'status' not in after_metadata and after_metadata['metadata']['generation'] == 1

    status_write = custom.patch_cluster_custom_object_status(*args, {'status': {'observedGeneration': 1},
                                                                      'spec': {'shim': 'ignored'}})
    assert status_write['status'] == {'observedGeneration': 1}
    assert status_write['spec']['shim'] == 'qemu-runtime-rs' and status_write['metadata']['generation'] == 1

    spec_write = custom.patch_cluster_custom_object(*args, {'spec': {'hugepages': True}})
    assert spec_write['metadata']['generation'] == 2 and spec_write['status'] == {'observedGeneration': 1}

    replaced = custom.replace_cluster_custom_object(*args, dict(spec_write, status={'overwritten': True}))
    assert replaced['status'] == {'observedGeneration': 1} and replaced['metadata']['generation'] == 2


def test_no_op_writes_keep_the_resource_version(emulator):
    emulator.objects('runtimeclasses').create(runtime_class('kata-same'))
    before = emulator.objects('runtimeclasses').get('kata-same')
    status, body = http(emulator, 'PATCH', f'{RUNTIMECLASSES}/kata-same',
                        {'handler': 'kata-same'}, 'application/merge-patch+json')
    assert status == 200 and body['metadata']['resourceVersion'] == before['metadata']['resourceVersion']


def test_label_and_field_selectors_filter_lists(emulator, api_client):
    configmaps = emulator.objects('configmaps')
    configmaps.create({'metadata': {'name': 'a', 'namespace': 'one', 'labels': {'app': 'x', 'tier': 'web'}}})
    configmaps.create({'metadata': {'name': 'b', 'namespace': 'one', 'labels': {'app': 'y'}}})
    configmaps.create({'metadata': {'name': 'c', 'namespace': 'two', 'labels': {'app': 'z', 'tier': 'db'}}})
    core = kubernetes.client.CoreV1Api(api_client)

    def names(**kwargs: str) -> list[str]:
        return sorted(cm.metadata.name for cm in core.list_config_map_for_all_namespaces(**kwargs).items)

    assert names() == ['a', 'b', 'c']
    assert names(label_selector='app=x') == ['a']
    assert names(label_selector='app!=x') == ['b', 'c']
    assert names(label_selector='tier') == ['a', 'c']
    assert names(label_selector='!tier') == ['b']
    assert names(label_selector='app in (x,z)') == ['a', 'c']
    assert names(label_selector='app notin (x),tier') == ['c']
    assert names(field_selector='metadata.name=b') == ['b']
    assert names(field_selector='metadata.namespace!=one') == ['c']
    assert [cm.metadata.name for cm in core.list_namespaced_config_map('one').items] == ['a', 'b']
    status, _ = http(emulator, 'GET', '/api/v1/configmaps?labelSelector=' + urllib.parse.quote('a in (b'))
    assert status == 400


def test_watch_replays_from_a_resource_version_without_losing_events(emulator):
    configmaps = emulator.objects('configmaps')
    configmaps.create({'metadata': {'name': 'before', 'namespace': 'ns'}})
    status, listing = http(emulator, 'GET', '/api/v1/namespaces/ns/configmaps')
    listed_at = listing['metadata']['resourceVersion']

    configmaps.create({'metadata': {'name': 'after', 'namespace': 'ns', 'labels': {'w': '1'}}})
    configmaps.patch('before', {'data': {'k': 'v'}}, 'ns')
    configmaps.create({'metadata': {'name': 'elsewhere', 'namespace': 'other'}})
    configmaps.delete('after', 'ns')

    events = watch(emulator, '/api/v1/namespaces/ns/configmaps', resourceVersion=listed_at, timeoutSeconds='1')
    assert [(e['type'], e['object']['metadata']['name']) for e in events] == [
        ('ADDED', 'after'), ('MODIFIED', 'before'), ('DELETED', 'after')]
    versions = [int(e['object']['metadata']['resourceVersion']) for e in events]
    assert versions == sorted(versions) and versions[0] > int(listed_at)

    from_scratch = watch(emulator, '/api/v1/configmaps', timeoutSeconds='1')
    assert sorted(e['object']['metadata']['name'] for e in from_scratch) == ['before', 'elsewhere']
    assert {e['type'] for e in from_scratch} == {'ADDED'}

    initial = watch(emulator, '/api/v1/configmaps', sendInitialEvents='true',
                    resourceVersionMatch='NotOlderThan', timeoutSeconds='1')
    assert [e['type'] for e in initial] == ['ADDED', 'ADDED', 'BOOKMARK']
    assert initial[-1]['object']['metadata']['annotations'] == {'k8s.io/initial-events-end': 'true'}

    labelled = watch(emulator, '/api/v1/configmaps', resourceVersion=listed_at,
                     labelSelector='w=1', timeoutSeconds='1')
    assert [(e['type'], e['object']['metadata']['name']) for e in labelled] == [
        ('ADDED', 'after'), ('DELETED', 'after')]


def test_live_watch_sees_direct_writes_and_ends_after_timeout_seconds(emulator):
    received: list[dict[str, Any]] = []
    started = time.monotonic()
    reader = threading.Thread(target=lambda: received.extend(
        watch(emulator, RUNTIMECLASSES, resourceVersion=emulator.store.resource_version, timeoutSeconds='1')))
    reader.start()
    wait_for(lambda: emulator.open_watch_count == 1)
    emulator.objects('runtimeclasses').create(runtime_class('live'))
    reader.join(5)
    elapsed = time.monotonic() - started
    assert [(e['type'], e['object']['metadata']['name']) for e in received] == [('ADDED', 'live')]
    assert 0.9 <= elapsed < 3
    assert emulator.open_watch_count == 0


def test_watch_from_a_compacted_resource_version_is_410_gone(emulator):
    emulator.objects('runtimeclasses').create(runtime_class('old'))
    emulator.objects('runtimeclasses').patch('old', {'metadata': {'labels': {'a': 'b'}}})
    emulator.compact_history()
    events = watch(emulator, RUNTIMECLASSES, resourceVersion='1', timeoutSeconds='5')
    assert len(events) == 1 and events[0]['type'] == 'ERROR'
    assert events[0]['object']['code'] == 410 and events[0]['object']['reason'] == 'Expired'


def test_runtimeclass_handler_is_immutable(emulator, api_client):
    node = kubernetes.client.NodeV1Api(api_client)
    node.create_runtime_class(runtime_class('kata-s', 'kata-s'))
    with pytest.raises(ApiException) as error:
        node.patch_runtime_class('kata-s', {'handler': 'kata-other'})
    assert error.value.status == 422
    body = json.loads(error.value.body)
    assert body['reason'] == 'Invalid'
    assert 'handler: Invalid value: "kata-other": field is immutable' in body['message']
    status, _ = http(emulator, 'PUT', f'{RUNTIMECLASSES}/kata-s', runtime_class('kata-s', 'kata-other'))
    assert status == 422
    assert node.read_runtime_class('kata-s').handler == 'kata-s'


def test_finalizers_turn_delete_into_a_deletion_timestamp_until_released(emulator, api_client):
    custom = kubernetes.client.CustomObjectsApi(api_client)
    args = ('katasizing.dev', 'v1alpha1', 'katasizingpolicies', 'fin')
    body = policy('fin')
    body['metadata']['finalizers'] = ['kopf.zalando.org/KopfFinalizerMarker']
    created = custom.create_cluster_custom_object(*args[:3], body)

    custom.delete_cluster_custom_object(*args)
    deleting = custom.get_cluster_custom_object(*args)
    assert deleting['metadata']['deletionTimestamp']
    status, _ = http(emulator, 'PATCH', f'{POLICIES}/fin', {'metadata': {'finalizers': ['another']}},
                     'application/merge-patch+json')
    assert status == 422  # no new finalizers on a deleting object

    custom.patch_cluster_custom_object(*args, {'metadata': {'finalizers': None}})
    with pytest.raises(ApiException) as gone:
        custom.get_cluster_custom_object(*args)
    assert gone.value.status == 404

    events = watch(emulator, POLICIES, resourceVersion=created['metadata']['resourceVersion'], timeoutSeconds='1')
    assert [e['type'] for e in events] == ['MODIFIED', 'DELETED']


def test_owner_references_are_garbage_collected(emulator):
    owner = emulator.objects('ksp').create(policy('owner'))
    reference = {'apiVersion': 'katasizing.dev/v1alpha1', 'kind': 'KataSizingPolicy',
                 'name': 'owner', 'uid': owner['metadata']['uid']}
    emulator.objects('runtimeclasses').create(dict(runtime_class('owned'), metadata={
        'name': 'owned', 'ownerReferences': [reference]}))
    emulator.objects('runtimeclasses').create(runtime_class('unowned'))
    emulator.objects('ksp').delete('owner')
    assert emulator.objects('runtimeclasses').names() == ['unowned']


def test_discovery_paths_with_and_without_trailing_slashes(emulator, api_client):
    for path in ('/api', '/api/', '/api/v1', '/api/v1/', '/apis', '/apis/', '/version', '/version/',
                 '/apis/katasizing.dev/v1alpha1', '/apis/katasizing.dev/v1alpha1/', '/apis/node.k8s.io/'):
        status, _ = http(emulator, 'GET', path)
        assert status == 200, path

    _, core = http(emulator, 'GET', '/api/v1/')
    assert {'namespaces', 'configmaps', 'events', 'nodes', 'pods', 'pods/status'} <= {
        r['name'] for r in core['resources']}
    _, groups = http(emulator, 'GET', '/apis/')
    assert {'node.k8s.io', 'katasizing.dev', 'apiextensions.k8s.io', 'events.k8s.io', 'coordination.k8s.io'} <= {
        g['name'] for g in groups['groups']}
    _, ksp = http(emulator, 'GET', '/apis/katasizing.dev/v1alpha1')
    assert {(r['name'], r['namespaced']) for r in ksp['resources']} == {
        ('katasizingpolicies', False), ('katasizingpolicies/status', False)}
    status, _ = http(emulator, 'GET', '/apis/unknown.example.com/v1/')
    assert status == 404

    assert kubernetes.client.CoreApi(api_client).get_api_versions().versions == ['v1']
    assert 'katasizing.dev' in {g.name for g in kubernetes.client.ApisApi(api_client).get_api_versions().groups}
    assert kubernetes.client.VersionApi(api_client).get_code().major == '1'


def test_added_resource_kinds_are_served(emulator):
    emulator.add_resource('apps/v1/deployments', kind='Deployment', namespaced=True, subresources=('status',))
    status, created = http(emulator, 'POST', '/apis/apps/v1/namespaces/ns/deployments',
                           {'metadata': {'name': 'd'}, 'spec': {}})
    assert status == 201 and created['kind'] == 'Deployment'
    _, groups = http(emulator, 'GET', '/apis')
    assert 'apps' in {g['name'] for g in groups['groups']}


def test_a_burst_of_500s_then_success_and_the_request_log(emulator, api_client):
    node = kubernetes.client.NodeV1Api(api_client)
    emulator.fail_next(2, status=500, method='POST', path='/runtimeclasses$')
    for _ in range(2):
        with pytest.raises(ApiException) as error:
            node.create_runtime_class(runtime_class('kata-retry'))
        assert error.value.status == 500
    assert emulator.objects('runtimeclasses').get('kata-retry') is None
    node.create_runtime_class(runtime_class('kata-retry'))
    node.read_runtime_class('kata-retry')

    writes = emulator.write_requests(path='runtimeclasses')
    assert [(r.method, r.status) for r in writes] == [('POST', 500), ('POST', 500), ('POST', 201)]
    assert [r[:4] for r in emulator.requests('GET')] == [
        ('GET', f'{RUNTIMECLASSES}/kata-retry', {}, 200)]
    emulator.reset_request_log()
    assert emulator.request_log == []


def test_injected_conflicts_latency_and_dropped_watches(emulator, api_client):
    node = kubernetes.client.NodeV1Api(api_client)
    node.create_runtime_class(runtime_class('kata-race'))
    emulator.conflict_next(1, path='kata-race')
    with pytest.raises(ApiException) as error:
        node.patch_runtime_class('kata-race', {'metadata': {'labels': {'a': 'b'}}})
    assert error.value.status == 409
    assert node.patch_runtime_class('kata-race', {'metadata': {'labels': {'a': 'b'}}}).metadata.labels == {'a': 'b'}

    emulator.add_latency(0.3, method='GET', count=1)
    started = time.monotonic()
    node.read_runtime_class('kata-race')
    assert time.monotonic() - started >= 0.3

    received: list[dict[str, Any]] = []
    reader = threading.Thread(target=lambda: received.extend(watch(emulator, RUNTIMECLASSES, timeoutSeconds='30')))
    reader.start()
    wait_for(lambda: emulator.open_watch_count == 1)
    assert emulator.drop_watches('runtimeclasses') == 1
    reader.join(5)
    assert not reader.is_alive()
    assert [e['object']['metadata']['name'] for e in received] == ['kata-race']


def test_kopf_operator_in_its_own_thread(emulator):
    registry = kopf.OperatorRegistry()
    kubeconfig = str(emulator.kubeconfig)

    @kopf.on.create('katasizing.dev', 'v1alpha1', 'katasizingpolicies', registry=registry)
    def create_values(name: str, spec: kopf.Spec, patch: kopf.Patch, **_: Any) -> None:
        with kubernetes.config.new_client_from_config(config_file=kubeconfig) as client:
            kubernetes.client.CoreV1Api(client).create_namespaced_config_map('kata-sizing', kubernetes.client.V1ConfigMap(
                metadata=kubernetes.client.V1ObjectMeta(name=f'{name}-values'), data={'shim': spec['shim']}))
        patch.status['phase'] = 'Ready'

    with KopfThread(emulator.kubeconfig, registry=registry,
                    settings_hook=lambda settings: setattr(settings.posting, 'enabled', False)) as operator:
        assert operator.settings.posting.enabled is False
        emulator.objects('katasizingpolicies').create(policy('smoke'))
        configmap = wait_for(lambda: emulator.objects('configmaps').get('smoke-values', 'kata-sizing'))
        assert configmap['data'] == {'shim': 'qemu-runtime-rs'}
        wait_for(lambda: emulator.objects('ksp').get('smoke').get('status', {}).get('phase') == 'Ready')
        started_stopping = time.monotonic()
    assert time.monotonic() - started_stopping < 5
    assert not [t for t in threading.enumerate() if t.name == 'kopf-operator']

    verbs = {(r.method, r.path) for r in emulator.request_log}
    assert ('POST', '/api/v1/namespaces/kata-sizing/configmaps') in verbs
    assert ('PATCH', f'{POLICIES}/smoke/status') in verbs
    assert any(r.is_watch and r.path == POLICIES for r in emulator.request_log)
