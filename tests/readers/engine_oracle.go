// engine_oracle reads stack files as the Pulumi engine does and prints the config map it hands a
// program: the path of LoadProjectStackBytes (sdk/go/common/workspace/loaders.go) and of
// config.Value/config.object (sdk/go/common/resource/config/value.go, object.go, plaintext.go) in
// pulumi/pulumi at 1b5949891b3c (3.259.0), with the YAML library it pins, gopkg.in/yaml.v3 v3.0.1.
// The functions below are copied from those files (Apache-2.0, Copyright 2016-2024 Pulumi
// Corporation), cut to what a stack without secrets uses.
//
// Input (stdin): a JSON list of {"name": ..., "yaml": ...}. Output (stdout): a JSON list of
// {"name": ..., "config": {key: text}} or {"name": ..., "config": null, "error": ...}.
//
// tests/readers/engine_corpus.py runs it to write tests/readers/engine_readings.json, the test data of
// tests/readers/test_engine_reading.py; it needs Go and yaml.v3 v3.0.1 (on Debian 12:
// `apt-get install golang-go golang-gopkg-yaml.v3-dev`), the suite does not.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	yaml "gopkg.in/yaml.v3"
)

const projectName = "multislice"

// ---- workspace/project.go: SimplifyMarshalledValue
func simplify(value any) (any, error) {
	if objMap, ok := value.(map[any]any); ok {
		strMap := make(map[string]any)
		for key, value := range objMap {
			if strKey, ok := key.(string); ok {
				inner, err := simplify(value)
				if err != nil {
					return nil, err
				}
				strMap[strKey] = inner
			} else {
				return nil, fmt.Errorf("expected only string keys, got '%s'", key)
			}
		}
		return strMap, nil
	} else if objArray, ok := value.([]any); ok {
		out := make([]any, len(objArray))
		for i, value := range objArray {
			inner, err := simplify(value)
			if err != nil {
				return nil, err
			}
			out[i] = inner
		}
		return out, nil
	}
	return value, nil
}

// ---- workspace/loaders.go: stackConfigNamespacedWithProject
func namespaced(stack map[string]any) map[string]any {
	config, ok := stack["config"]
	if ok {
		if configAsMap, isMap := config.(map[string]any); isMap {
			modified := make(map[string]any)
			for key, value := range configAsMap {
				if strings.Contains(key, ":") {
					modified[key] = value
				} else {
					modified[fmt.Sprintf("%s:%s", projectName, key)] = value
				}
			}
			stack["config"] = modified
		}
	}
	return stack
}

// ---- util/yamlutil/encode.go: YamlEncode
func yamlEncode(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("error marshaling value %#v: %w", v, err)
	}
	return b.Bytes(), nil
}

// ---- resource/config/object.go
type object struct{ value any }

func unmarshalObject(v any) (object, error) {
	switch v := v.(type) {
	case bool:
		return object{v}, nil
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return object{i}, nil
		}
		f, err := v.Float64()
		if err == nil {
			return object{f}, nil
		}
		return object{}, fmt.Errorf("unrepresentable number %v: %w", v, err)
	case int:
		return object{int64(v)}, nil
	case uint64:
		return object{v}, nil
	case int64:
		return object{v}, nil
	case float64:
		return object{v}, nil
	case string:
		return object{v}, nil
	case time.Time:
		return object{v.String()}, nil
	case map[string]any:
		if len(v) == 1 {
			if s, ok := v["secure"].(string); ok {
				return object{}, fmt.Errorf("secure value %q: this oracle reads stacks without secrets", s)
			}
		}
		m := make(map[string]object, len(v))
		for k, v := range v {
			sv, err := unmarshalObject(v)
			if err != nil {
				return object{}, err
			}
			m[k] = sv
		}
		return object{m}, nil
	case map[any]any:
		m := make(map[string]any, len(v))
		for k, v := range v {
			m[fmt.Sprintf("%v", k)] = v
		}
		return unmarshalObject(m)
	case []any:
		a := make([]object, len(v))
		for i, v := range v {
			sv, err := unmarshalObject(v)
			if err != nil {
				return object{}, err
			}
			a[i] = sv
		}
		return object{a}, nil
	case nil:
		return object{}, nil
	default:
		return object{}, fmt.Errorf("unexpected wire type %T", v)
	}
}

func (c object) MarshalJSON() ([]byte, error) { return json.Marshal(c.value) }

func (c *object) UnmarshalYAML(unmarshal func(any) error) error {
	var v any
	if err := unmarshal(&v); err != nil {
		return err
	}
	var err error
	*c, err = unmarshalObject(v)
	return err
}

func (c *object) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return err
	}
	var err error
	*c, err = unmarshalObject(v)
	return err
}

func (c object) MarshalString() (text string, isObject bool, err error) {
	switch v := c.value.(type) {
	case bool, int64, uint64, float64:
		b, err := c.MarshalJSON()
		return string(b), false, err
	case string:
		return v, false, nil
	default:
		b, err := c.MarshalJSON()
		if err != nil {
			return "", false, err
		}
		return string(b), true, nil
	}
}

// goValue is plaintext.go's GoValue for a value without secrets.
func (c object) goValue() any {
	switch v := c.value.(type) {
	case []object:
		vs := make([]any, len(v))
		for i, v := range v {
			vs[i] = v.goValue()
		}
		return vs
	case map[string]object:
		vs := make(map[string]any, len(v))
		for k, v := range v {
			vs[k] = v.goValue()
		}
		return vs
	default:
		return v
	}
}

// ---- resource/config/value.go
type Value struct {
	value  string
	object bool
}

func (c *Value) UnmarshalYAML(unmarshal func(any) error) error {
	var obj object
	if err := obj.UnmarshalYAML(unmarshal); err != nil {
		return err
	}
	var err error
	c.value, c.object, err = obj.MarshalString()
	return err
}

// text is Map.Decrypt with a decrypter: unmarshalObject, decrypt, then plaintext.go's marshalText.
func (c Value) text() (string, error) {
	var obj object
	if !c.object {
		obj = object{c.value}
	} else if err := obj.UnmarshalJSON([]byte(c.value)); err != nil {
		return "", err
	}
	if s, ok := obj.value.(string); ok {
		return s, nil
	}
	b, err := json.Marshal(obj.goValue())
	return string(b), err
}

// ---- resource/config/key.go: ParseKey, for the forms a stack file writes
func parseKey(s string) (string, error) {
	switch strings.Count(s, ":") {
	case 1:
		return s, nil
	case 2:
		parts := strings.Split(s, ":")
		if parts[1] == "config" && parts[0] != "" && parts[2] != "" {
			return parts[0] + ":" + parts[2], nil
		}
	}
	return "", fmt.Errorf("could not parse %s as a configuration key "+
		"(configuration keys should be of the form `<namespace>:<name>`)", s)
}

type projectStack struct {
	SecretsProvider string           `yaml:"secretsprovider,omitempty"`
	EncryptedKey    string           `yaml:"encryptedkey,omitempty"`
	EncryptionSalt  string           `yaml:"encryptionsalt,omitempty"`
	Config          map[string]Value `yaml:"config,omitempty"`
	Environment     any              `yaml:"environment,omitempty"`
}

// ---- workspace/loaders.go: LoadProjectStackBytes, then Map.Decrypt
func load(b []byte) (map[string]string, error) {
	b = bytes.TrimPrefix(b, []byte("\xef\xbb\xbf")) // readFileStripUTF8BOM
	var raw any
	if err := yaml.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("invalid YAML file: %w", err)
	}
	result := map[string]string{}
	if raw == nil {
		return result, nil
	}
	simple, err := simplify(raw)
	if err != nil {
		return nil, err
	}
	asMap, ok := simple.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("expected project to be an object, was '%T'", simple)
	}
	modified, _ := yamlEncode(namespaced(asMap))
	var stack projectStack
	if err := yaml.Unmarshal(modified, &stack); err != nil {
		return nil, fmt.Errorf("invalid YAML file: %w", err)
	}
	for k, v := range stack.Config {
		key, err := parseKey(k)
		if err != nil {
			return nil, fmt.Errorf("could not unmarshal map: %w", err)
		}
		text, err := v.text()
		if err != nil {
			return nil, err
		}
		result[key] = text
	}
	return result, nil
}

type input struct {
	Name string `json:"name"`
	YAML string `json:"yaml"`
}

type output struct {
	Name   string            `json:"name"`
	Config map[string]string `json:"config"`
	Error  string            `json:"error,omitempty"`
}

func main() {
	var inputs []input
	if err := json.NewDecoder(os.Stdin).Decode(&inputs); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	outputs := make([]output, 0, len(inputs))
	for _, in := range inputs {
		config, err := func() (config map[string]string, err error) {
			defer func() {
				if r := recover(); r != nil {
					err = errors.New(fmt.Sprint(r))
				}
			}()
			return load([]byte(in.YAML))
		}()
		out := output{Name: in.Name, Config: config}
		if err != nil {
			out.Error = err.Error()
			out.Config = nil
		}
		outputs = append(outputs, out)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", " ")
	if err := enc.Encode(outputs); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
