// Command celcost prints the runtime CEL cost of admission policies on pods, computed by the
// API server's own CEL evaluation (k8s.io/apiserver at the control plane's pin), for `make
// bench` (bench/admission_bench.py). The API server estimates no cost for a
// ValidatingAdmissionPolicy or MutatingAdmissionPolicy when it is created (the object is
// untyped there) and reports none when it evaluates one; it only stops an evaluation that
// exceeds a limit: 1,000,000 for one expression (PerCallLimit), 10,000,000 for one evaluation
// of a policy for one binding (RuntimeCELCostBudget), 2,500,000 for its match conditions.
//
// Input (stdin, JSON): {"policies": [ValidatingAdmissionPolicy | MutatingAdmissionPolicy],
// "params": {ConfigMap data}, "namespaceLabels": {...}, "pods": [Pod]}. Each pod is judged as
// a CREATE in its namespace, with the ConfigMap as the policies' params.
//
// Output (stdout, JSON): per pod, per policy: "total" (what the evaluation charges against
// RuntimeCELCostBudget: the validations and, as the API server does on every request, the
// message expressions, with the variables they evaluate; for a MutatingAdmissionPolicy its
// mutations), "matchConditions", "largestExpression" and its "largestExpressionName" (the most
// one expression or variable costs on its own, against PerCallLimit), and "error" when the API
// server would stop the evaluation.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	celgo "github.com/google/cel-go/cel"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
)

type input struct {
	Policies        []map[string]any  `json:"policies"`
	Params          map[string]string `json:"params"`
	NamespaceLabels map[string]string `json:"namespaceLabels"`
	Pods            []map[string]any  `json:"pods"`
	// false: the totals and the first error only, not each expression's own cost (which compiles
	// and evaluates the policy once per variable).
	Breakdown *bool `json:"breakdown"`
}

type policyCost struct {
	Name                  string `json:"name"`
	Total                 int64  `json:"total"`
	MatchConditions       int64  `json:"matchConditions"`
	LargestExpression     int64  `json:"largestExpression"`
	LargestExpressionName string `json:"largestExpressionName"`
	// Every variable's and expression's own cost, in the policy's order.
	Expressions [][2]any `json:"expressions"`
	Error                 string `json:"error,omitempty"`
}

type podCost struct {
	Pod      string       `json:"pod"`
	Policies []policyCost `json:"policies"`
}

// anyExpression is a mutation (an Object) or a list of variables: any type.
type anyExpression struct{ expression string }

func (a *anyExpression) GetExpression() string      { return a.expression }
func (a *anyExpression) ReturnTypes() []*celgo.Type { return []*celgo.Type{celgo.AnyType} }
func condition(expression string) *anyExpression    { return &anyExpression{expression} }

// policy is one admission policy compiled as the API server compiles it.
type policy struct {
	name       string
	variables  []admissionregistrationv1.Variable
	conditions []admissionregistrationv1.MatchCondition
	checked    []plugincel.ExpressionAccessor // validations, or the mutations
	messages   []plugincel.ExpressionAccessor // message expressions (validating policies)
	checkNames []string
	patchTypes bool
}

func parsePolicy(raw map[string]any) (*policy, error) {
	data, err := json.Marshal(raw)
	if err != nil {
		return nil, err
	}
	switch raw["kind"] {
	case "ValidatingAdmissionPolicy":
		var vap admissionregistrationv1.ValidatingAdmissionPolicy
		if err := json.Unmarshal(data, &vap); err != nil {
			return nil, err
		}
		p := &policy{name: vap.Name, variables: vap.Spec.Variables, conditions: vap.Spec.MatchConditions}
		for i, v := range vap.Spec.Validations {
			p.checked = append(p.checked, &validating.ValidationCondition{Expression: v.Expression, Message: v.Message})
			p.checkNames = append(p.checkNames, fmt.Sprintf("validations[%d]", i))
			if v.MessageExpression != "" {
				p.messages = append(p.messages, &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression})
			}
		}
		return p, nil
	case "MutatingAdmissionPolicy":
		var mp admissionregistrationv1.MutatingAdmissionPolicy
		if err := json.Unmarshal(data, &mp); err != nil {
			return nil, err
		}
		p := &policy{name: mp.Name, variables: mp.Spec.Variables, conditions: mp.Spec.MatchConditions, patchTypes: true}
		for i, m := range mp.Spec.Mutations {
			expression := ""
			if m.ApplyConfiguration != nil {
				expression = m.ApplyConfiguration.Expression
			} else if m.JSONPatch != nil {
				expression = m.JSONPatch.Expression
			}
			p.checked = append(p.checked, condition(expression))
			p.checkNames = append(p.checkNames, fmt.Sprintf("mutations[%d]", i))
		}
		return p, nil
	}
	return nil, fmt.Errorf("not an admission policy: %v", raw["kind"])
}

// evaluation is one pod's request as the admission plugins see it.
type evaluation struct {
	attr      *admission.VersionedAttributes
	namespace *corev1.Namespace
	params    *unstructured.Unstructured
}

func newEvaluation(pod map[string]any, params map[string]string, labels map[string]string) *evaluation {
	object := &unstructured.Unstructured{Object: pod}
	gvk := schema.GroupVersionKind{Version: "v1", Kind: "Pod"}
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	namespace := object.GetNamespace()
	attr := admission.NewAttributesRecord(object, nil, gvk, namespace, object.GetName(), gvr, "", admission.Create,
		&metav1.CreateOptions{}, false, &user.DefaultInfo{Name: "bench"})
	data := map[string]any{}
	for k, v := range params {
		data[k] = v
	}
	labelsAny := map[string]string{"kubernetes.io/metadata.name": namespace}
	for k, v := range labels {
		labelsAny[k] = v
	}
	return &evaluation{
		attr:      &admission.VersionedAttributes{Attributes: attr, VersionedObject: admission.NewLazyObject(object), VersionedKind: gvk},
		namespace: &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace, Labels: labelsAny}},
		params: &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "params"}, "data": data}},
	}
}

// run compiles `expressions` with the policy's variables and evaluates them in one activation
// (as the API server does for one list of expressions): the cost charged, and the first error.
func (p *policy) run(ev *evaluation, expressions []plugincel.ExpressionAccessor, patchTypes bool, budget int64) (int64, string) {
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		return 0, err.Error()
	}
	opts := plugincel.OptionalVariableDeclarations{HasParams: true}
	variables := make([]plugincel.NamedExpressionAccessor, len(p.variables))
	for i, v := range p.variables {
		variables[i] = &validating.Variable{Name: v.Name, Expression: v.Expression}
	}
	compiler.CompileAndStoreVariables(variables, opts, environment.StoredExpressions)
	exprOpts := opts
	exprOpts.HasPatchTypes = patchTypes
	evaluator := compiler.CompileCondition(expressions, exprOpts, environment.StoredExpressions)
	gvr := metav1.GroupVersionResource{Version: "v1", Resource: "pods"}
	gvk := metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}
	request := plugincel.CreateAdmissionRequest(ev.attr.Attributes, gvr, gvk)
	results, remaining, err := evaluator.ForInput(context.Background(), ev.attr, request,
		plugincel.OptionalVariableBindings{VersionedParams: ev.params}, plugincel.CreateNamespaceObject(ev.namespace), budget)
	if err != nil {
		return budget, err.Error()
	}
	for _, r := range results {
		if r.Error != nil {
			return budget - remaining, r.Error.Error()
		}
	}
	return budget - remaining, ""
}

func (p *policy) cost(ev *evaluation, breakdown bool) policyCost {
	out := policyCost{Name: p.name}
	budget := int64(celconfig.RuntimeCELCostBudget)
	matchers := make([]plugincel.ExpressionAccessor, len(p.conditions))
	for i, c := range p.conditions {
		matchers[i] = condition(c.Expression)
	}
	out.MatchConditions, out.Error = p.run(ev, matchers, false, celconfig.RuntimeCELCostBudgetMatchConditions)
	checks, checkErr := p.run(ev, p.checked, p.patchTypes, budget)
	messages, messageErr := int64(0), ""
	if len(p.messages) > 0 && checkErr == "" {
		messages, messageErr = p.run(ev, p.messages, false, budget-checks)
	}
	out.Total = checks + messages
	for _, e := range []string{checkErr, messageErr} {
		if out.Error == "" && e != "" {
			out.Error = e
		}
	}
	if !breakdown {
		return out
	}
	// Each variable's own cost: the cost of evaluating the variables up to it, less the cost up to
	// the one before (a variable reads only the ones before it; the list literal adds a few units).
	// The elements are booleans: the API server's CEL wants the elements of a list literal of one type.
	previous := int64(0)
	for i, v := range p.variables {
		names := make([]string, i+1)
		for k := range names {
			names[k] = "type(variables." + p.variables[k].Name + ") != null_type"
		}
		upTo, problem := p.run(ev, []plugincel.ExpressionAccessor{condition("[" + strings.Join(names, ", ") + "]")}, false, budget)
		if problem != "" && out.Error == "" {
			out.Error = problem
		}
		own := upTo - previous
		out.Expressions = append(out.Expressions, [2]any{"variables." + v.Name, own})
		if own > out.LargestExpression {
			out.LargestExpression, out.LargestExpressionName = own, "variables."+v.Name
		}
		previous = upTo
	}
	all := make([]string, len(p.variables))
	for k, v := range p.variables {
		all[k] = "type(variables." + v.Name + ") != null_type"
	}
	allVariables := condition("[" + strings.Join(all, ", ") + "]")
	for i, check := range append(append([]plugincel.ExpressionAccessor{}, p.checked...), p.messages...) {
		patchTypes := p.patchTypes && i < len(p.checked)
		with, _ := p.run(ev, []plugincel.ExpressionAccessor{allVariables, check}, patchTypes, budget)
		name := fmt.Sprintf("messageExpression %d", i-len(p.checked))
		if i < len(p.checked) {
			name = p.checkNames[i]
		}
		own := with - previous
		out.Expressions = append(out.Expressions, [2]any{name, own})
		if own > out.LargestExpression {
			out.LargestExpression, out.LargestExpressionName = own, name
		}
	}
	return out
}

func main() {
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintln(os.Stderr, "celcost: reading the input:", err)
		os.Exit(2)
	}
	policies := make([]*policy, 0, len(in.Policies))
	for _, raw := range in.Policies {
		p, err := parsePolicy(raw)
		if err != nil {
			fmt.Fprintln(os.Stderr, "celcost:", err)
			os.Exit(2)
		}
		policies = append(policies, p)
	}
	sort.SliceStable(policies, func(i, j int) bool { return policies[i].name < policies[j].name })
	out := make([]podCost, 0, len(in.Pods))
	for _, pod := range in.Pods {
		ev := newEvaluation(pod, in.Params, in.NamespaceLabels)
		result := podCost{Pod: ev.attr.GetName()}
		for _, p := range policies {
			result.Policies = append(result.Policies, p.cost(ev, in.Breakdown == nil || *in.Breakdown))
		}
		out = append(out, result)
	}
	encoder := json.NewEncoder(os.Stdout)
	encoder.SetIndent("", "  ")
	if err := encoder.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "celcost:", err)
		os.Exit(1)
	}
}
