package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// writeCredentials writes the CA, every certificate and token the components use, their
// kubeconfigs, and the audit policy. Every identity is the one a kubeadm cluster gives the
// same component, so the bootstrap RBAC roles and the Node authorizer apply unchanged.
func writeCredentials(dir, server string, address net.IP, nodeName, saUser string) error {
	file := func(name string) string { return filepath.Join(dir, name) }
	ca, caKey, err := newCA()
	if err != nil {
		return err
	}
	if err := writePEM(file("ca.crt"), "CERTIFICATE", ca.Raw, 0o644); err != nil {
		return err
	}
	if err := writeKey(file("ca.key"), caKey); err != nil {
		return err
	}
	serverAuth := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	clientAuth := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	leaves := []struct {
		name, commonName string
		organizations    []string
		ips              []net.IP
		dnsNames         []string
		usage            []x509.ExtKeyUsage
	}{
		// Reached on the address, on loopback, and from pods through the kubernetes Service.
		{"serving", "kube-apiserver", nil,
			[]net.IP{address, net.ParseIP("127.0.0.1"), net.ParseIP(kubernetesSvcIP)},
			[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
				"kubernetes.default.svc.cluster.local"}, serverAuth},
		// The API server's identity towards the kubelet (logs, exec, proxy, stats).
		{"kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil, clientAuth},
		// The kubelet's identity: the Node authorizer and NodeRestriction key on these names.
		{"node", "system:node:" + nodeName, []string{"system:nodes"}, nil, nil, clientAuth},
		// The kubelet's serving certificate; the API server checks it against the CA.
		{"kubelet", nodeName, nil, []net.IP{address}, []string{nodeName}, serverAuth},
	}
	for _, l := range leaves {
		if err := writeLeaf(dir, l.name, ca, caKey, l.commonName, l.organizations, l.ips, l.dnsNames, l.usage); err != nil {
			return err
		}
	}

	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	if err := writePEM(file("sa.key"), "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey), 0o600); err != nil {
		return err
	}

	admin, operator, schedulerToken, proxyToken := token(), token(), token(), token()
	ns := "default"
	if parts := strings.Split(saUser, ":"); len(parts) == 4 {
		ns = parts[2]
	}
	tokens := fmt.Sprintf("%s,admin,admin-uid,\"system:masters\"\n"+
		"%s,%s,operator-uid,\"system:serviceaccounts,system:serviceaccounts:%s,system:authenticated\"\n"+
		"%s,system:kube-scheduler,kube-scheduler-uid\n"+
		"%s,system:kube-proxy,kube-proxy-uid\n",
		admin, operator, saUser, ns, schedulerToken, proxyToken)
	if err := os.WriteFile(file("tokens.csv"), []byte(tokens), 0o600); err != nil {
		return err
	}
	auditPolicy := fmt.Sprintf(`apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
# The status patches of a policy with their bodies: what a pass changed, when a test counts them.
- level: Request
  verbs: [patch, update]
  resources: [{group: "katasizing.dev", resources: [katasizingpolicies/status]}]
- level: Metadata
  users: [%q]
# Every ServiceAccount too: the operator installed by its chart on the node runs as its own.
- level: Metadata
  userGroups: ["system:serviceaccounts"]
# Pod creations and resizes, whoever makes them: the admission policies' Audit action shows here.
- level: Metadata
  verbs: [create, patch, update]
  resources: [{group: "", resources: [pods, pods/resize]}]
- level: None
`, saUser)
	files := map[string]string{
		"admin.token": admin, "operator.token": operator, "audit-policy.yaml": auditPolicy,
		"admin.kubeconfig":     kubeconfig(server, file("ca.crt"), "admin", fmt.Sprintf("token: %q", admin)),
		"scheduler.kubeconfig": kubeconfig(server, file("ca.crt"), "kube-scheduler", fmt.Sprintf("token: %q", schedulerToken)),
		"proxy.kubeconfig":     kubeconfig(server, file("ca.crt"), "kube-proxy", fmt.Sprintf("token: %q", proxyToken)),
		"node.kubeconfig": kubeconfig(server, file("ca.crt"), "node",
			fmt.Sprintf("client-certificate: %q, client-key: %q", file("node.crt"), file("node.key"))),
	}
	for name, value := range files {
		if err := os.WriteFile(file(name), []byte(value), 0o600); err != nil {
			return err
		}
	}
	return nil
}

func kubeconfig(server, ca, user, credentials string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: controlplane
  cluster: {server: %q, certificate-authority: %q}
users:
- name: %s
  user: {%s}
contexts:
- name: %s
  context: {cluster: controlplane, user: %s}
current-context: %s
`, server, ca, user, credentials, user, user, user)
}

func newCA() (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	template := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "kata-sizing-test-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	raw, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(raw)
	return cert, key, err
}

func writeLeaf(dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, commonName string,
	organizations []string, ips []net.IP, dnsNames []string, usage []x509.ExtKeyUsage) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	template := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: commonName, Organization: organizations},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
		IPAddresses:  ips,
		DNSNames:     dnsNames,
	}
	raw, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, name+".crt"), "CERTIFICATE", raw, 0o644); err != nil {
		return err
	}
	return writeKey(filepath.Join(dir, name+".key"), key)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der, 0o600)
}

func writePEM(path, kind string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), mode)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err)
	}
	return n
}

func token() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
